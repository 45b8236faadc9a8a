"""An ablation's runs on the machines of a Ray cluster (``xlapipe ablate ... --ray ADDRESS``).

Each run is a Ray task pinned to one machine (a node) that holds that
machine's whole accelerator: by default every ``TPU`` the host has, or the
resources asked for (``{"TPU-v4-16-head": 1}``: a slice's first host). A
machine takes a whole round at a time and runs it in the round's random order,
so the paired comparisons never mix machines. On the machine the task starts
the run as a fresh interpreter, in the driver's working folder (which must
exist there: a shared file system or the same checkout on every host), and
sends back the outcome and the end of the log. A run whose machine dies is run
once more on another; a run that fails by itself is recorded as failed.

Ray is the optional extra: ``pip install 'xlapipe[ray]'``.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import evolve, frozen

from xlapipe.ablation import on_node
from xlapipe.ablation.engines import Calls, Job, Spec
from xlapipe.ablation.target import Target

INSTALL = "pip install 'xlapipe[ray]'"
CHECK_TIMEOUT = 120.0  # seconds each machine has to answer the check before any run starts


def import_ray() -> Any:
    """Ray, or an ImportError that says how to install it."""
    try:
        import ray
        import ray.cloudpickle
    except ImportError:
        raise ImportError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    ray.cloudpickle.register_pickle_by_value(on_node)  # the machines never import xlapipe (or torch) for it
    return ray


@frozen
class Machine:
    """A node of the cluster that can take a run: its id, host name and the resources a run holds."""

    node: str
    host: str
    resources: dict[str, float]

    @property
    def record(self) -> dict[str, Any]:
        return {"host": self.host, "node": self.node}

    @property
    def name(self) -> str:
        return f"{self.host}/{self.node[:8]}"


def machines(nodes: Sequence[Mapping[str, Any]], asked: Mapping[str, float] | None) -> list[Machine]:
    """The live nodes that have what a run asks for (default: the node's every ``TPU``)."""
    found = []
    for n in nodes:
        have = n.get("Resources") or {}
        if not n.get("Alive"):
            continue
        if asked is None:
            if have.get("TPU", 0) > 0:
                found.append(Machine(n["NodeID"], n.get("NodeManagerHostname", ""), {"TPU": have["TPU"]}))
        elif all(have.get(k, 0) >= v for k, v in asked.items()):
            found.append(Machine(n["NodeID"], n.get("NodeManagerHostname", ""), dict(asked)))
    return found


def _offered(node: Mapping[str, Any]) -> str:
    """A node's resources a run could ask for, with their amounts (``CPU 1, TPU 4``)."""
    have = node.get("Resources") or {}
    shown = [f"{k} {v:g}" for k, v in sorted(have.items()) if not k.startswith("node:") and "memory" not in k]
    return ", ".join(shown) or "nothing"


def check_reachable(address: str) -> None:
    """Refuse a ``host:port`` address nothing listens on (Ray itself would retry for a minute)."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(
            f"--ray takes 'auto' or the head node's HOST:PORT (e.g. 10.0.0.2:6379), got {address!r}"
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address} ({error}): start it with `ray start --head` on the "
            "head machine and give the address it prints (`ray status` there shows it), or --ray auto on a node"
        ) from None


class RayFleet:
    """Runs waves of rounds on the machines of a Ray cluster (see the module's docstring)."""

    def __init__(
        self,
        address: str,
        resources: Mapping[str, float] | None,
        tgt: Target,
        env: Mapping[str, str],
    ) -> None:
        self.ray = import_ray()
        self.address, self.asked = address, None if resources is None else dict(resources)
        self.tgt, self.env = tgt, dict(env)
        self.cwd = os.getcwd()
        self.lost: set[str] = set()
        self.connected_here = False
        self.fleet: list[Machine] = []

    # -- before any run ------------------------------------------------------------------
    def connect(self) -> None:
        """Join the cluster and check every machine can run the target; refuse with the fix otherwise."""
        ray = self.ray
        if not ray.is_initialized():
            check_reachable(self.address)
            try:
                ray.init(address=self.address, log_to_driver=False, logging_level="warning")
            except ConnectionError as error:
                raise ConnectionError(
                    f"cannot join the Ray cluster at {self.address}: {error}. Start it with `ray start --head` "
                    "(then `ray start --address HEAD:6379` on each other machine) and give --ray HEAD:6379"
                ) from None
            self.connected_here = True
        self.fleet = machines(ray.nodes(), self.asked)
        if not self.fleet:
            what = "a TPU" if self.asked is None else f"the resources {self.asked}"
            raise RuntimeError(
                f"no machine of the Ray cluster at {self.address} has {what} (its nodes have: "
                f"{'; '.join(sorted({_offered(n) for n in ray.nodes() if n.get('Alive')}))}); "
                "start Ray on the TPU hosts, or ask for what they have with --ray-resources JSON"
            )
        self._check_paths()

    def _check_paths(self) -> None:
        paths = [] if self.tgt.kind == "function" and ".py:" not in self.tgt.spec else [self._file()]
        check = self.ray.remote(num_cpus=0, max_retries=0)(on_node.check_here)
        refs = [
            (m, check.options(scheduling_strategy=self._on(m)).remote(paths, self.cwd, self.tgt.imports))
            for m in self.fleet
        ]
        problems = []
        for m, ref in refs:
            try:
                answer = self.ray.get(ref, timeout=CHECK_TIMEOUT)
            except Exception as error:  # a machine that cannot import xlapipe, or does not answer
                problems.append(f"{m.name}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
                continue
            if answer["missing"]:
                problems.append(f"{m.name} ({answer['host']}): no {', '.join(answer['missing'])}")
        if problems:
            raise RuntimeError(
                "these machines cannot run the target, so no run was started:\n  "
                + "\n  ".join(problems)
                + "\n"
                f"Every machine needs xlapipe installed and {self.cwd} with the script (and the --import "
                "modules, unless installed) in it at the same path "
                "(a shared file system, or the same checkout on each host); docs/scale-out.md"
            )

    def _file(self) -> str:
        spec = self.tgt.spec
        return spec.rpartition(":")[0] if self.tgt.kind == "function" else spec

    def _on(self, m: Machine) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(m.node, soft=False)

    @property
    def slots(self) -> int:
        return max(1, len([m for m in self.fleet if m.node not in self.lost]))

    @property
    def how(self) -> str:
        return f"fresh interpreters on {self.slots} machine(s) of the Ray cluster at {self.address}"

    def close(self) -> None:
        if self.connected_here:
            self.ray.shutdown()

    # -- the runs ----------------------------------------------------------------------------
    def command(self, spec: Spec) -> tuple[list[str], dict[str, str]]:
        """The run's command and what its environment adds, its report path left for the machine to fill in."""
        here = str(spec.report)
        cmd = ["python", *(a.replace(here, on_node.REPORT) for a in spec.cmd[1:])]
        return cmd, {**self.env, **{k: v.replace(here, on_node.REPORT) for k, v in spec.env.items()}}

    def run_wave(self, rounds: Sequence[Sequence[Job]], calls: Calls) -> str:
        ray = self.ray
        lost_errors = (
            ray.exceptions.NodeDiedError,
            ray.exceptions.TaskUnschedulableError,
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.ObjectLostError,
        )
        task = ray.remote(num_cpus=0, max_retries=0)(on_node.run_on_machine)
        queue = collections.deque(list(r) for r in rounds if r)
        current: dict[str, collections.deque[Job]] = {}
        flying: dict[Any, tuple[Machine, Job, Spec]] = {}
        stopped = ""
        try:
            while True:
                busy = {m.node for m, _, _ in flying.values()}
                for m in self.fleet:
                    if stopped or m.node in self.lost or m.node in busy:
                        continue
                    work = current.get(m.node)
                    if not work:
                        if not queue:
                            continue
                        work = current[m.node] = collections.deque(queue.popleft())
                    why = calls.admit(work[0])
                    if why:
                        stopped = why
                        break
                    job = work.popleft()
                    spec = calls.prepare(job)
                    calls.starting(job, m.name)
                    cmd, env = self.command(spec)
                    ref = task.options(resources=m.resources, scheduling_strategy=self._on(m)).remote(
                        cmd, env, spec.limit, self.cwd, m.node
                    )
                    flying[ref] = (m, job, spec)
                if not flying:
                    left = sum(len(w) for w in current.values()) + sum(len(r) for r in queue)
                    if left and not stopped and self.slots and all(m.node in self.lost for m in self.fleet):
                        stopped = f"every machine of the Ray cluster was lost; {left} run(s) not made"
                    break
                (ref,), _ = ray.wait(list(flying), num_returns=1)
                m, job, spec = flying.pop(ref)
                try:
                    answer = ray.get(ref)
                except lost_errors as error:
                    self.lost.add(m.node)
                    rest = list(current.pop(m.node, ()))
                    outcome = _lost(error, job)
                    spec.log.write_text(f"{outcome['error']}\n")  # the attempt keeps a log of its own
                    calls.finish(job, spec, outcome, m.record)
                    again = [evolve(job, attempt=2)] if job.attempt == 1 else []
                    if again or rest:
                        queue.appendleft([*again, *rest])
                    continue
                except ray.exceptions.RayTaskError as error:  # xlapipe's own side failed on the machine
                    answer = {"outcome": _failed(str(error)), "log": str(error)}
                spec.log.write_text(answer["log"])
                calls.finish(job, spec, answer["outcome"], m.record)
        except BaseException:
            for ref in flying:  # Ctrl-C, SIGTERM: the runs in flight stop with the driver
                ray.cancel(ref, force=True)
            raise
        return stopped


def _lost(error: Exception, job: Job) -> dict[str, Any]:
    again = "run again on another machine" if job.attempt == 1 else "not run again (its second attempt)"
    first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    return {
        "status": "lost",
        "returncode": None,
        "report": None,
        "elapsed_s": 0.0,
        "error": f"{first}; {again}",
    }


def _failed(text: str) -> dict[str, Any]:
    return {"status": "error", "returncode": None, "report": None, "elapsed_s": 0.0, "error": text[-3000:]}
