"""What every section of bad inputs shares: the case record, the message as read, scratch files, a run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

import xlapipe as xp
from helpers import loss_fn, tiny_setup
from xlapipe import checkpoint

SCRATCH = tempfile.mkdtemp(prefix="xlapipe-bad-inputs-")  # shown as <tmp> in docs/errors.md


class Case(NamedTuple):
    id: str
    did: str  # what the user did, as they would write it
    call: Callable[[], Any]
    raises: type[BaseException]
    fragment: str  # must appear in the message


def message_of(error: BaseException) -> str:
    """What the user reads after the exception's type (KeyError quotes its argument)."""
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error)


def scratch(name: str) -> str:
    return os.path.join(SCRATCH, name)


def _enter(setup: Any) -> None:
    with xp.session(setup):
        pass


def _step(setup: xp.TrainingSetup) -> None:
    with xp.session(setup) as run:
        run.step(next(iter(run.loaders["train"])), loss_fn)


def _with_run(action: Callable[[xp.Run], Any], setup: xp.TrainingSetup | None = None) -> Any:
    with xp.session(setup or xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        return action(run)


def _saved(name: str, scheduler: bool = False) -> str:
    """A real checkpoint of the tiny workload (with a scheduler state when asked)."""
    path = scratch(name)

    def save(run: xp.Run) -> None:
        sched = torch.optim.lr_scheduler.StepLR(run.optimizer, 1) if scheduler else None
        checkpoint.save(path, run, step=1, scheduler=sched)

    _with_run(save)
    return path


def _file(name: str, content: bytes | None = None, obj: Any = None) -> str:
    path = scratch(name)
    if obj is not None:
        torch.save(obj, path)
    else:
        with open(path, "wb") as f:
            f.write(content or b"")
    return path
