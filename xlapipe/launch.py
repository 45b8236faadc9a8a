"""launch: run a training function on every local XLA device, model built once.

The parent builds the model (and the whole setup) on the CPU, without touching
the XLA device, then calls ``launch(train, setup)``. Replicas are *forked*
(``torch_xla.launch(..., start_method="fork")``), so ``train`` and its
arguments are inherited through the fork, never pickled: every replica reads
the parent's host copy of the weights, which is what lets
:func:`xlapipe.wrap_model_mp` keep one copy in host memory. Each replica
realises the setup itself (``with xlapipe.session(setup) as run: ...``).

On the CPU runtime ``torch_xla.launch`` forks one process that drives each
CPU device from a thread (one device unless ``CPU_NUM_DEVICES`` says
otherwise); on a TPU VM it forks one process per chip.

The result: ``launch`` returns what replica 0 (global ordinal 0) returned,
handed back through a temporary file, so it must be picklable; the other
replicas' return values are dropped. On a multi-host pod, hosts that do not
run replica 0 get None. An exception in a replica is raised in the caller.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from xlapipe import effects, runtime
from xlapipe.training_setup import TrainingSetup

R = TypeVar("R")

# What the forked replicas run, keyed by a token: set in the parent right
# before the fork and inherited by the children, so nothing here is pickled.
_JOBS: dict[str, tuple[Callable[..., Any], tuple, dict, str]] = {}
RESULT_FILE = "replica0.pkl"


def _refuse_if_started() -> None:
    if runtime.started():
        raise RuntimeError(
            "xlapipe.launch: torch_xla's runtime has already started in this process "
            "(something touched the XLA device: torch_xla.device(), xlapipe.session on an "
            "XLA setup, a tensor moved to 'xla', ...). torch_xla cannot fork replicas "
            "after its runtime starts. Build the model, optimizer and loaders on the CPU "
            "in the parent, apply the pipeline (it only decides, it moves nothing), and "
            "let each replica realise the setup with xlapipe.session inside the "
            "function given to launch."
        )


def _refuse_cpu_threads() -> None:
    if os.environ.get("PJRT_DEVICE", "").upper() != "CPU":
        return
    count = os.environ.get("CPU_NUM_DEVICES", "1")
    if count.isdigit() and int(count) > 1:
        raise RuntimeError(
            f"xlapipe.launch: CPU_NUM_DEVICES={count} would run {count} replicas as threads "
            "of one process, and torch_xla 2.9's collectives (the gradient all-reduce in "
            "every step) deadlock across CPU devices in that mode. Unset CPU_NUM_DEVICES "
            "(or set it to 1) to launch on the CPU runtime; use SPMD to try several "
            "CPU devices."
        )


def _startup_effects(args: tuple, kwargs: dict) -> list:
    """The effects read when a runtime starts (``XLA_USE_BF16``...) of the setups passed.

    The replicas' runtimes start as they are forked, before any session, so
    these are applied here, in the parent, for the duration of the launch.
    """
    found = [
        e
        for value in (*args, *kwargs.values())
        if isinstance(value, TrainingSetup)
        for e in value.effects
        if e.before_runtime
    ]
    return list(dict.fromkeys(found))


def _replica(index: int, token: str) -> None:
    fn, args, kwargs, outdir = _JOBS[token]
    result = fn(index, *args, **kwargs)
    if index == 0:
        try:
            data = pickle.dumps(result)
        except Exception as error:
            raise TypeError(
                "xlapipe.launch hands replica 0's return value back to the caller by "
                f"pickling it, and a {type(result).__name__} cannot be pickled ({error}); "
                "return plain data (numbers, strings, dicts, CPU tensors)"
            ) from error
        with open(os.path.join(outdir, RESULT_FILE), "wb") as f:
            f.write(data)


def launch(fn: Callable[..., R], *args: Any, debug_single_process: bool = False, **kwargs: Any) -> R | None:
    """Call ``fn(index, *args, **kwargs)`` on every local XLA device; return replica 0's result.

    ``index`` is the replica's global ordinal. Replicas are forked from this
    process, which must not have touched the XLA device yet. Environment
    effects of any :class:`TrainingSetup` among the arguments (those read when
    the runtime starts) are in force while the replicas start. With
    ``debug_single_process`` ``fn`` runs once, in this process, on one device
    (this process's runtime is then started and a later ``launch`` is refused).
    """
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on each replica, got {type(fn).__name__}")
    _refuse_if_started()
    if not debug_single_process:
        _refuse_cpu_threads()
    import torch_xla

    token = f"{os.getpid()}-{len(_JOBS)}-{id(fn)}"
    outdir = tempfile.mkdtemp(prefix="xlapipe-launch-")
    _JOBS[token] = (fn, args, kwargs, outdir)
    try:
        with effects.applied(_startup_effects(args, kwargs)):
            torch_xla.launch(
                _replica, args=(token,), start_method="fork", debug_single_process=debug_single_process
            )
        path = os.path.join(outdir, RESULT_FILE)
        if not os.path.exists(path):
            return None  # replica 0 runs on another host
        with open(path, "rb") as f:
            result: R = pickle.load(f)
        return result
    finally:
        _JOBS.pop(token, None)
        shutil.rmtree(outdir, ignore_errors=True)
