"""Checkpoints of a :class:`~xlapipe.session.Run` that survive faults.

>>> with xp.session(setup) as run:
...     step = checkpoint.restore(path, run) if os.path.exists(path) else 0
...     ...
...     checkpoint.save(path, run, step=step)

A checkpoint holds the model, optimizer, gradient scaler (fp16), scheduler
(the run's own, ``TrainingSetup(scheduler=...)``, or one passed as
``scheduler=``), the step, the run's step and update counts, and every
random number generator a run draws from (Python's
``random``, NumPy's global one when installed, torch's CPU generator, and the
XLA device's), so a resumed run follows the uninterrupted one.

Writing is atomic: the state is moved to the CPU, written to a temporary file
in the same folder, flushed to disk (``fsync``) and renamed over the old
checkpoint (``os.replace``). A process killed while saving leaves the previous
checkpoint whole (and at worst a stray ``.<name>.*.tmp`` file beside it). Saving
ends the pending step but leaves the run's random stream as it was. Only
the main replica (global ordinal 0) writes; every replica takes part in the
transfer, as ``torch_xla.core.xla_model.save`` does.
"""
from __future__ import annotations

import contextlib
import os
import random
import secrets
from collections.abc import Mapping
from typing import Any

import torch

from xlapipe.run import Run

FORMAT = "xlapipe-checkpoint/1"


# -- what is saved -----------------------------------------------------------------

def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator a run draws from, as plain data and CPU tensors."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy as np

        np_state = np.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype("int64")),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        }
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        state["xla"] = int(xm.get_rng_state(device))
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Put back what :func:`rng_state` took (generators it did not save are left alone)."""
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy as np

            s = state["numpy"]
            np.random.set_state({
                "bit_generator": s["bit_generator"],
                "state": {"key": s["key"].numpy().astype(np.uint32), "pos": s["pos"]},
                "has_gauss": s["has_gauss"], "gauss": s["gauss"],
            })
    if "xla" in state and device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(state["xla"], device)


# torch_xla's step marker moves the device's RNG seed on: seed = ADD + MUL * seed
# (mod 2**64; DeviceContextArena::MarkStep in torch_xla 2.9). Its inverse lets a
# save end the pending step without changing the random stream of the run.
_MARK_STEP_ADD, _MARK_STEP_MUL = 1012031, 7012063
_MARK_STEP_MUL_INVERSE = pow(_MARK_STEP_MUL, -1, 2**64)


def _end_pending_step(device: torch.device) -> None:
    """Execute the pending graph, leaving the XLA seed where the next step marker expects it.

    Between two steps ``xm.get_rng_state`` is the *running* seed (moved on by
    every random op traced since the last step marker), not the seed the next
    marker starts from. A sync makes them equal, at the cost of one marker; the
    seed is then set back by that marker, so the run that saves draws the same
    numbers as one that does not, and a run restored from the file draws them too.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    marked = int(xm.get_rng_state(device))
    xm.set_rng_state(((marked - _MARK_STEP_ADD) * _MARK_STEP_MUL_INVERSE) % 2**64, device)


def _scheduler(run: Run, scheduler: Any) -> Any:
    """The run's own scheduler, or the one the caller keeps (not both)."""
    if scheduler is not None and run.scheduler is not None and scheduler is not run.scheduler:
        raise ValueError(
            "this run has its own scheduler (TrainingSetup(scheduler=...)), which checkpoints save "
            "and restore; do not pass another one as scheduler=..."
        )
    return run.scheduler if scheduler is None else scheduler


def _state(run: Run, step: int, scheduler: Any, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "step": step,
        "run": {"steps": run.steps, "updates": run.updates},
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict() if run.optimizer is not None else None,
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(run.device),
        "extra": dict(extra or {}),
    }


# -- who writes, and how -------------------------------------------------------------

def _replicas(run: Run) -> tuple[bool, int]:
    """(is this the main replica, how many replicas take part)."""
    if run.device.type != "xla":
        return True, 1
    import torch_xla.runtime as xr

    return xr.global_ordinal() == 0, xr.world_size()


def write_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj)`` to ``path`` so that ``path`` is always either old or new, whole."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (POSIX)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def save(
    path: str | os.PathLike,
    run: Run,
    *,
    step: int,
    scheduler: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> bool:
    """Save ``run`` at ``step`` (and ``scheduler``, and ``extra`` plain data / CPU tensors).

    Call it on every replica: all take part in the transfer to the host, the
    main replica writes. Returns True in the replica that wrote.
    """
    if not isinstance(run, Run):
        raise TypeError(f"save takes the Run that xlapipe.session(...) yields, got {type(run).__name__}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"save: step must be a non-negative int, got {step!r}")
    scheduler = _scheduler(run, scheduler)
    for hook in run.hooks:
        hook.before_save()
    main, replicas = _replicas(run)
    if run.device.type == "xla":
        _end_pending_step(run.device)
    state = _state(run, step, scheduler, extra)
    if run.device.type == "xla":
        import torch_xla.core.xla_model as xm

        state = xm._maybe_convert_to_cpu(state, convert=main)
    if main:
        write_atomic(state, path)
    if replicas > 1:
        import torch_xla.core.xla_model as xm

        xm.rendezvous("xlapipe.checkpoint.save")  # nobody reads it before it is whole
    return main


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path`` as CPU tensors and plain data (``extra`` included)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {os.fspath(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{os.fspath(path)!r} is not a readable xlapipe checkpoint: {error}") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            f"{os.fspath(path)!r} is not an xlapipe checkpoint (expected format {FORMAT!r}); "
            "write checkpoints with xlapipe.checkpoint.save"
        )
    return state


def _match(name: str, saved: Any, present: bool, how: str) -> None:
    if (saved is not None) != present:
        raise ValueError(
            f"restore: the checkpoint {'holds' if saved is not None else 'has no'} {name} state "
            f"and this run {'has' if present else 'has no'} {name}; {how}"
        )


def restore(path: str | os.PathLike, run: Run, *, scheduler: Any = None) -> int:
    """Load the checkpoint at ``path`` into ``run`` (and ``scheduler``); return its step.

    Call it on every replica, right after the session starts and before the
    first step. The model's parameters keep their identity (and sharding), so
    the run's optimizer stays bound to them.
    """
    if not isinstance(run, Run):
        raise TypeError(f"restore takes the Run that xlapipe.session(...) yields, got {type(run).__name__}")
    scheduler = _scheduler(run, scheduler)
    state = load(path)
    _match("optimizer", state["optimizer"], run.optimizer is not None,
           "build the setup with the same optimizer as the run that saved it")
    _match("scheduler", state["scheduler"], scheduler is not None,
           "pass scheduler=... exactly when the saving run did")
    _match("gradient scaler", state["scaler"], run.scaler is not None,
           "restore with the precision the run was saved with (fp16 uses a scaler)")
    run.model.load_state_dict(state["model"])
    if run.optimizer is not None:
        run.optimizer.load_state_dict(state["optimizer"])
    if run.scaler is not None:
        run.scaler.load_state_dict(state["scaler"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"], run.device)
    counts = state.get("run", {})
    run.steps, run.updates = int(counts.get("steps", 0)), int(counts.get("updates", 0))
    return int(state["step"])
