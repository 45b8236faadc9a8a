"""checkpoint_on_preemption: on SIGTERM, finish the step, save, and stop; started again, resume.

A preemptible (spot) TPU VM is told it will be taken by a SIGTERM, with a
short notice (about 30 s on Google Cloud). Under this practice the session
catches SIGTERM instead of dying: the step in flight finishes, the run is
saved to ``path`` with :func:`xlapipe.checkpoint.save` at that step's end, once
every practice has seen the step (``Hook.between_steps``, wherever this
practice is listed: a practice's ``after_step`` state is part of the save); a
signal that arrives between steps is acted on when an evaluation under
``run.evaluating()`` ends, the epoch ends, or the next step ends; and the process then
stops as the signal would have stopped it: :class:`Preempted` (a
``SystemExit`` with status 143, 128 + SIGTERM) ends the training loop, the
session closes normally, and the script exits unless it catches it.

When the session starts and ``path`` exists, the run is restored from it
(:func:`xlapipe.checkpoint.restore`) before the session hands it over, so the
same script started again continues exactly: written as
``for epoch in range(run.epoch, epochs): for batch in run.batches("train")``,
it resumes inside the interrupted epoch, at the next batch. The step given to
``save`` is ``run.steps``; ``extra`` holds ``{"preempted": True}``.

SIGTERM is caught in the main thread only (Python delivers signals there);
the handler in place before the session is put back when it ends, normally
or not. The run's DataLoader worker processes ignore SIGTERM (their
``worker_init_fn`` is wrapped): a signal sent to the whole process group, as
a VM's shutdown or a scheduler's cancel sends it, leaves them to the main
process, which saves and then stops them.

What could not be saved at SIGTERM is refused when the session starts, not
found out at the signal: every practice's ``before_save`` is asked then (and
again after the first step, when ``compile_step`` has seen its graphs), a
compiled (``openxla``) forward with dropout in the model is refused, and so
is a loader whose position inside an epoch cannot be saved (an iterable that
is neither a DataLoader, a list, nor a loader with ``state_dict``).
``compile_step(optimizer=True)`` excludes this practice outright.

The file belongs to one run. It records the run's identity (digests of the
pipeline, the model's keys, shapes and dtypes, the optimizer's class and
hyperparameters and the scheduler's class at the session's start, the loaders'
types, lengths and batch sizes) in ``extra["identity"]``; a session whose
identity differs (another ``--lr``, an ablation's variant) is refused at its
start, naming the file, never restored from it nor silently ignored. A
session that ends normally (no error, not preempted) removes the file: the
run it holds is finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from attrs import field, frozen
from torch.utils.data import DataLoader

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.transform import Transform, practice, register

EXIT_STATUS = 128 + signal.SIGTERM  # what a shell reports for a process SIGTERM ended


class Preempted(SystemExit):
    """The run was asked to stop (SIGTERM), saved, and stops: the process exits with status 143."""


@frozen
class CheckpointOnPreemption(Hook):
    """The practice's parameters and its hook."""

    path: str = field(validator=checks.text("checkpoint_on_preemption", "path"))

    def start(self, run: Context) -> Hook:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "checkpoint_on_preemption catches SIGTERM, which Python delivers to the main thread "
                "only; start the session in the main thread, or drop the practice"
            )
        return _OnPreemption(self.path, run)


class _OnPreemption(Hook):
    def __init__(self, path: str, run: Context) -> None:
        self.path, self.run = path, run
        self.signalled = False
        self.ready = False  # the session started (restored, if there was a file) and was handed over
        self.saved = False  # this session saved the run at a SIGTERM
        self.checked_graphs = False
        self.identity = identity(run)
        self.workers = _quiet_workers(run)
        self.previous = signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.signalled = True

    def after_start(self) -> None:
        self._check_saveable()
        for loader in getattr(self.run, "positions", {}).values():
            problem = loader.why_not_resumable_inside_epoch()
            if problem is not None:
                raise ValueError(
                    f"checkpoint_on_preemption: a SIGTERM inside an epoch could not be saved: {problem}"
                )
        if os.path.exists(self.path):
            from xlapipe import checkpoint

            self._check_identity(checkpoint.load(self.path)["extra"])
            checkpoint.restore(self.path, self.run)  # type: ignore[arg-type]  # the run this hook is part of
        self.ready = True

    def _check_saveable(self) -> None:
        """Raise now what a save at SIGTERM would raise (every practice's ``before_save``)."""
        problem = _compiled_dropout(self.run)
        for hook in self.run.hooks:
            if problem is not None:
                break
            try:
                hook.before_save()
            except Exception as error:  # noqa: BLE001 - any refusal is the one to report
                problem = str(error)
        if problem is not None:
            raise ValueError(
                "checkpoint_on_preemption: this run could not be saved at a SIGTERM, so a preemption "
                f"would save nothing: {problem}. Change that, or drop checkpoint_on_preemption"
            )

    def _check_identity(self, extra: Any) -> None:
        theirs = extra.get("identity") if isinstance(extra, dict) else None
        if theirs == self.identity:
            return
        if isinstance(theirs, dict):
            parts = sorted(
                k for k in set(theirs) | set(self.identity) if theirs.get(k) != self.identity.get(k)
            )
            why = f"by another run: its {', '.join(parts)} differ from this run's"
        else:
            why = "by something other than checkpoint_on_preemption (it records no run identity)"
        raise ValueError(
            f"checkpoint_on_preemption: {self.path!r} was written {why}, so restoring it would continue "
            "that run, not this one. To resume that run, start it as it was; to start this one fresh, "
            f"delete {self.path!r} or give checkpoint_on_preemption(path=...) another path. Nothing was "
            "restored"
        )

    @contextlib.contextmanager
    def outside_step(self) -> Iterator[None]:
        yield
        self._stop_if_signalled()  # e.g. after an evaluation that the signal arrived in

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        if not self.checked_graphs:
            self.checked_graphs = True
            self._check_saveable()  # compile_step has now seen what its graphs draw

    def between_steps(self) -> None:
        self._stop_if_signalled()  # every practice has seen the step: wherever this one is listed

    def _stop_if_signalled(self) -> None:
        if not self.signalled:
            return
        from xlapipe import checkpoint

        self.signalled = False
        extra = {"preempted": True, "identity": self.identity}
        checkpoint.save(self.path, self.run, step=self.run.steps, extra=extra)  # type: ignore[arg-type]
        self.saved = True
        print(
            f"checkpoint_on_preemption: SIGTERM received; saved the run after step {self.run.steps} "
            f"to {self.path}. Stopping (status {EXIT_STATUS}); start the script again to resume.",
            file=sys.stderr,
            flush=True,
        )
        raise Preempted(EXIT_STATUS)

    def close(self) -> None:
        try:
            signal.signal(signal.SIGTERM, self.previous)
        finally:
            for loader, init in self.workers:
                loader.worker_init_fn = init
            finished = self.ready and not self.run.failed and not self.saved
            if finished and getattr(self.run, "is_main", True):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)  # the run it held is finished: no later run may resume it


class _IgnoreSigterm:
    """A DataLoader worker's ``worker_init_fn``: SIGTERM ignored, then the loader's own function."""

    def __init__(self, init: Callable[[int], None] | None) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the main process saves, then stops us
        if self.init is not None:
            self.init(worker_id)


def _quiet_workers(run: Context) -> list[tuple[DataLoader, Any]]:
    """Make the run's DataLoader workers ignore SIGTERM; return (loader, its own worker_init_fn)."""
    changed = []
    for tracked in getattr(run, "positions", {}).values():
        loader = tracked.loader
        if isinstance(loader, DataLoader) and loader.num_workers > 0:
            changed.append((loader, loader.worker_init_fn))
            loader.worker_init_fn = _IgnoreSigterm(loader.worker_init_fn)
    return changed


def _compiled_dropout(run: Context) -> str | None:
    """Why compile_step's openxla backend would refuse a save because of dropout in the model."""
    from xlapipe.transforms.compile_step import CompileStep

    compiled = any(
        isinstance(spec := getattr(h, "spec", None), CompileStep) and spec.backend == "openxla"
        for h in run.hooks
    )
    dropout = [
        name
        for name, m in run.model.named_modules()
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
    ]
    if compiled and dropout:
        return (
            f"the model has dropout ({', '.join(dropout[:3])}) and compile_step(backend='openxla') "
            "refuses checkpoints while its compiled forward draws random numbers (torch_xla 2.9 cannot "
            "repeat them on a resume). Use compile_step(backend='torch_xla'), or no dropout (p=0)"
        )
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return value if isinstance(value, (str, int, bool, type(None))) else repr(value)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(_plain(value), sort_keys=True).encode()).hexdigest()[:16]


def _class(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def identity(run: Any) -> dict[str, str]:
    """Digests of what makes a run this run: its pipeline, model, optimizer, scheduler and loaders."""
    setup = run.setup
    optimizer = run.optimizer
    groups = [] if optimizer is None else optimizer.param_groups
    loaders = []
    for name, loader in sorted(setup.loaders.items()):
        try:
            length: int | None = len(loader)
        except TypeError:
            length = None
        loaders.append([name, _class(loader), length, getattr(loader, "batch_size", None)])
    return {
        "pipeline": _digest([[t.name, list(t.params)] for t in setup.applied]),
        "model": _digest([[k, list(v.shape), str(v.dtype)] for k, v in setup.module.state_dict().items()]),
        "optimizer": _digest(
            [_class(optimizer)]
            + [{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in groups]
        ),
        "scheduler": _digest(_class(run.scheduler)),
        "loaders": _digest(loaders),
    }


@register
def checkpoint_on_preemption(path: str = "preempted.pt") -> Transform:
    """On SIGTERM, save the run at the end of the step in flight and stop; resume from ``path`` at start."""
    return practice("checkpoint_on_preemption", CheckpointOnPreemption(path))


claims.declare(
    Claim(
        "checkpoint_on_preemption",
        lambda: checkpoint_on_preemption("preempted.pt"),
        summary="on SIGTERM, the step finished, the run saved, the process stopped; resumed at start",
        refuses=[
            claims.Refusal("iterable", "a SIGTERM inside an epoch could not be saved", when="session"),
        ],
    )
)
