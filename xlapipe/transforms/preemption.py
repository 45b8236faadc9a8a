"""checkpoint_on_preemption: on SIGTERM, finish the step, save, and stop; started again, resume.

A preemptible (spot) TPU VM is told it will be taken by a SIGTERM, with a
short notice (about 30 s on Google Cloud). Under this practice the session
catches SIGTERM instead of dying: the step in flight finishes, the run is
saved to ``path`` with :func:`xlapipe.checkpoint.save` at that step's end (the
step boundary; a signal that arrives between steps is acted on when an
evaluation under ``run.evaluating()`` ends, the epoch ends, or the next step
ends), and the process then
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
the handler in place before the session is put back when it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
from attrs import field, frozen

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
        self.previous = signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.signalled = True

    def after_start(self) -> None:
        if os.path.exists(self.path):
            from xlapipe import checkpoint

            checkpoint.restore(self.path, self.run)  # type: ignore[arg-type]  # the run this hook is part of

    @contextlib.contextmanager
    def outside_step(self) -> Iterator[None]:
        yield
        self._stop_if_signalled()  # e.g. after an evaluation that the signal arrived in

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        self._stop_if_signalled()

    def end_epoch(self) -> None:
        self._stop_if_signalled()

    def _stop_if_signalled(self) -> None:
        if not self.signalled:
            return
        from xlapipe import checkpoint

        self.signalled = False
        checkpoint.save(self.path, self.run, step=self.run.steps, extra={"preempted": True})  # type: ignore[arg-type]
        print(
            f"checkpoint_on_preemption: SIGTERM received; saved the run after step {self.run.steps} "
            f"to {self.path}. Stopping (status {EXIT_STATUS}); start the script again to resume.",
            file=sys.stderr,
            flush=True,
        )
        raise Preempted(EXIT_STATUS)

    def close(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)


@register
def checkpoint_on_preemption(path: str = "preempted.pt") -> Transform:
    """On SIGTERM, save the run at the end of the step in flight and stop; resume from ``path`` at start."""
    return practice("checkpoint_on_preemption", CheckpointOnPreemption(path))


claims.declare(
    Claim(
        "checkpoint_on_preemption",
        lambda: checkpoint_on_preemption("preempted.pt"),
        summary="on SIGTERM, the step finished, the run saved, the process stopped; resumed at start",
    )
)
