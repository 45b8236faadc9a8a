"""Host memory of forked replicas: what wrap_model_mp saves, measured as PSS.

    python -m bench.memory --config wrap_model_mp --replicas 4 --model base --out mem.json

On the CPU runtime ``torch_xla.launch`` runs one process (several devices are
threads of it), so the replicas are forked here by hand: the parent forks
``--replicas`` workers, each with ``CPU_NUM_DEVICES=1``, each starting its own
XLA runtime and realising its setup (``xlapipe.session``), as a replica of
:func:`xlapipe.launch` does on a TPU host. At three points every worker
stops and the parent sums the proportional set size (PSS, from
``/proc/<pid>/smaps_rollup``: a page shared by k processes counts 1/k in each)
of itself and all workers:

- ``runtime``: the XLA runtime started, nothing else done;
- ``host``: the host copy of the model is there (built, or inherited by fork);
- ``realised``: the session has moved a copy of the model to the XLA device.

Configurations (``--config``):

- ``replica_builds``: every replica builds its own model (the torch_xla
  pattern ``MpModelWrapper`` replaces); pipeline ``with_device``;
- ``wrap_model_mp``: the parent builds the model once; pipeline
  ``with_device, wrap_model_mp``; replicas inherit it through the fork;
- ``parent_builds``: the parent builds it once, pipeline ``with_device`` only.

On the CPU runtime the "device" is host memory too: the ``realised`` figures
include one device copy of the weights per replica, which on a TPU host would
live in the chips' memory. ``device_copies_mb`` (replicas x weight bytes) is
reported so the reader can take it out; it is computed, not measured.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

PHASES = ("runtime", "host", "realised")
CONFIGS = ("replica_builds", "wrap_model_mp", "parent_builds")
FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def smaps(pid: int) -> dict[str, float]:
    """Memory figures of ``pid`` in MiB from ``/proc/<pid>/smaps_rollup``."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in FIELDS:
                out[key] = int(rest.split()[0]) / 1024
    return out


def build(model: str, seed: int = 0):
    """The NLP example's BERT at size ``model`` (base, small or tiny)."""
    from bench import workloads

    return workloads.bert(model)(seed)


def weights_mb(module) -> float:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values()) / 2**20


def pipeline(config: str):
    import xlapipe as xp
    from xlapipe import transforms as t

    return (
        xp.Pipeline(t.with_device(), t.wrap_model_mp())
        if config == "wrap_model_mp"
        else xp.Pipeline(t.with_device())
    )


def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=2e-5)


def _worker(index: int, config: str, model: str, setup, queue, go) -> None:
    try:
        os.environ["CPU_NUM_DEVICES"] = "1"
        import torch_xla

        import xlapipe as xp

        torch_xla.device()
        _stop(queue, go, "runtime", index)
        if setup is None:
            setup = pipeline(config)(xp.TrainingSetup(build(model), _adamw))
        _stop(queue, go, "host", index)
        with xp.session(setup) as run:
            assert next(run.model.parameters()).device.type == "xla"
            _stop(queue, go, "realised", index)
    except BaseException as error:  # tell the parent instead of hanging it
        queue.put(("error", index, f"{type(error).__name__}: {error}"))
        raise


def _stop(queue, go, phase: str, index: int) -> None:
    queue.put((phase, index, os.getpid()))
    if not go[phase].wait(timeout=900):
        raise TimeoutError(f"the parent never released phase {phase}")


def measure(config: str, replicas: int, model: str, timeout: float = 900) -> dict:
    """Fork ``replicas`` workers under ``config``; PSS totals at each phase."""
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {', '.join(CONFIGS)}")
    from xlapipe import runtime

    runtime.ensure_pjrt_device()
    if runtime.started():
        raise RuntimeError("bench.memory must run in a process whose XLA runtime has not started")
    from transformers import BertForSequenceClassification  # noqa: F401  imported before the fork in every config

    import xlapipe as xp
    from bench import workloads

    workloads.nlp_example()  # the model's code is imported before the fork in every config, too

    setup = None
    weights = None
    if config != "replica_builds":
        module = build(model)
        weights = weights_mb(module)
        setup = pipeline(config)(xp.TrainingSetup(module, _adamw))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    go = {phase: ctx.Event() for phase in PHASES}
    workers = [
        ctx.Process(target=_worker, args=(i, config, model, setup, queue, go)) for i in range(replicas)
    ]
    for w in workers:
        w.start()
    phases = {}
    try:
        for phase in PHASES:
            seen = 0
            deadline = time.monotonic() + timeout
            while seen < replicas:
                kind, index, info = queue.get(timeout=max(1.0, deadline - time.monotonic()))
                if kind == "error":
                    raise RuntimeError(f"replica {index} failed: {info}")
                seen += 1
            time.sleep(0.5)  # let freed pages settle
            per = {"parent": smaps(os.getpid())} | {
                f"replica{i}": smaps(w.pid) for i, w in enumerate(workers)
            }
            phases[phase] = {
                "total": {k: sum(p.get(k, 0.0) for p in per.values()) for k in FIELDS},
                "processes": per,
            }
            go[phase].set()
        for w in workers:
            w.join(timeout=120)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
    if weights is None:
        weights = weights_mb(build(model))
    return {
        "workload": "memory",
        "config": config,
        "replicas": replicas,
        "model": model,
        "pipeline": repr(pipeline(config)),
        "weights_mb": weights,
        "device_copies_mb": replicas * weights,
        "total_pss_mb": {phase: phases[phase]["total"]["Pss"] for phase in PHASES},
        "phases": phases,
        "exitcodes": [w.exitcode for w in workers],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, choices=CONFIGS)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--model", default="base", choices=("base", "small", "tiny"))
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    report = measure(opts.config, opts.replicas, opts.model)
    with open(opts.out, "w") as f:
        json.dump(report, f)
    return 0 if all(code == 0 for code in report["exitcodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
