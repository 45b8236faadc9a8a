"""Where an ablation's runs run: one at a time on this machine, or on the machines of a Ray cluster.

The runner hands an engine *waves*: lists of rounds. A round always runs whole
on one machine, in its random order, so a round is one block of the paired
comparison (a round, a machine); a wave gives each machine a round of its own.
On this machine (:class:`Local`) a wave is one round; on a Ray cluster
(:mod:`xlapipe.ablation.fleet`) it is as many rounds as there are machines.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from attrs import frozen

from xlapipe.ablation import on_node
from xlapipe.ablation.variants import Variant


@frozen
class Job:
    """One run to make: a variant in a round, at its place in the round's random order."""

    round: int
    index: int  # the variant's place in the plan
    variant: Variant
    position: int
    attempt: int = 1  # 2: run again after its machine was lost


@frozen
class Spec:
    """How the runner would run a job here: command, environment added, time limit, log and report."""

    cmd: list[str]
    env: dict[str, str]
    limit: float
    log: Path
    report: Path


class Calls(Protocol):
    """What the runner does around each run an engine makes."""

    def admit(self, job: Job) -> str:
        """ "" when ``job`` may start now, else why not (the budget): nothing more is started."""

    def prepare(self, job: Job) -> Spec: ...

    def starting(self, job: Job, machine: str) -> None: ...

    def finish(self, job: Job, spec: Spec, outcome: dict[str, Any], machine: Mapping[str, Any]) -> None:
        """Record the run's outcome (status ``lost``: its machine went away; it is run again elsewhere)."""


class Engine(Protocol):
    @property
    def slots(self) -> int:
        """Machines: rounds run at once."""

    @property
    def how(self) -> str:
        """For the header: where and how the runs run."""

    def run_wave(self, rounds: Sequence[Sequence[Job]], calls: Calls) -> str:
        """Run ``rounds`` (each whole on one machine); why the runs stopped early, or ""."""


def this_machine() -> dict[str, Any]:
    """The machine a local run ran on, as each record names it (a cluster's runs add the node id)."""
    return {"host": socket.gethostname(), "node": None}


class Local:
    """One run at a time on this machine, each a fresh interpreter (:mod:`xlapipe.child_process`)."""

    slots = 1
    how = "one at a time, each a fresh interpreter"

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)  # every run's environment, before what its job adds

    def run_wave(self, rounds: Sequence[Sequence[Job]], calls: Calls) -> str:
        here = this_machine()
        for jobs in rounds:
            for job in jobs:
                why = calls.admit(job)
                if why:
                    return why
                spec = calls.prepare(job)
                calls.starting(job, "")
                env = {**self.env, **spec.env}
                outcome = on_node.run_here(spec.cmd, env, spec.limit, None, spec.log, spec.report)
                calls.finish(job, spec, outcome, here)
        return ""
