"""Bad inputs: Checkpoints: what cannot be saved or load back, damaged files, runs they do not fit."""

from __future__ import annotations

import argparse
import datetime
import pathlib
from typing import Any

import numpy as np
import torch
from torch import nn

import xlapipe as xp
from bad_inputs.common import Case, _file, _saved, _with_run, scratch
from helpers import tiny_loader, tiny_model, tiny_setup
from xlapipe import checkpoint

CHECKPOINT = [
    Case(
        "ckpt-save-model",
        "checkpoint.save(path, model, step=1)",
        lambda: checkpoint.save(scratch("m.pt"), tiny_model(), step=1),
        TypeError,
        "save takes the Run that xlapipe.session(...) yields, got Sequential",
    ),
    Case(
        "ckpt-save-step",
        "checkpoint.save(path, run, step=-1)",
        lambda: _with_run(lambda run: checkpoint.save(scratch("s.pt"), run, step=-1)),
        ValueError,
        "step must be a non-negative int, got -1",
    ),
    Case(
        "ckpt-missing",
        "checkpoint.restore('missing.pt', run)",
        lambda: _with_run(lambda run: checkpoint.restore(scratch("missing.pt"), run)),
        FileNotFoundError,
        "no checkpoint at",
    ),
    Case(
        "ckpt-not-torch",
        "checkpoint.load(path_of_a_text_file)",
        lambda: checkpoint.load(_file("notes.txt", b"step=3\n")),
        ValueError,
        "is not a readable xlapipe checkpoint",
    ),
    Case(
        "ckpt-foreign",
        "checkpoint.load(path) of torch.save(model.state_dict(), path)",
        lambda: checkpoint.load(_file("weights.pt", obj=tiny_model().state_dict())),
        ValueError,
        "is not an xlapipe checkpoint (expected format 'xlapipe-checkpoint/3')",
    ),
    Case(
        "ckpt-scheduler-missing",
        "checkpoint.restore(path, run) of a checkpoint saved with a scheduler",
        lambda: _with_run(lambda run: checkpoint.restore(_saved("sched.pt", scheduler=True), run)),
        ValueError,
        "the checkpoint holds scheduler state and this run has no scheduler",
    ),
    Case(
        "ckpt-other-model",
        "checkpoint.restore(path, run) into a run of another architecture",
        lambda: _with_run(
            lambda run: checkpoint.restore(_saved("tiny.pt"), run),
            xp.with_device()(xp.TrainingSetup(nn.Linear(8, 2), lambda p: torch.optim.SGD(p, lr=0.1))),
        ),
        ValueError,
        "the checkpoint's model does not fit this run's model (not in the checkpoint: bias, weight",
    ),
    Case(
        "ckpt-no-optimizer",
        "checkpoint.restore(path, run) into a run without an optimizer",
        lambda: _with_run(
            lambda run: checkpoint.restore(_saved("tiny.pt"), run),
            xp.with_device()(xp.TrainingSetup(tiny_model())),
        ),
        ValueError,
        "the checkpoint holds optimizer state and this run has no optimizer",
    ),
]


def _save_extra(extra: Any) -> None:
    _with_run(lambda run: checkpoint.save(scratch("extra.pt"), run, step=1, extra=extra))


def _restore_into(setup: xp.TrainingSetup, path: str) -> None:
    _with_run(lambda run: checkpoint.restore(path, run), xp.with_device()(setup))


def _damaged(name: str) -> str:
    """A real checkpoint with one bit flipped inside the model's first weight."""
    path = _saved(name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = bytes(data).find(checkpoint.load(path)["model"]["0.weight"].numpy().tobytes()) + 3
    data[at] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)
    return path


def _own_generator(shuffle: bool) -> xp.TrainingSetup:
    loader = torch.utils.data.DataLoader(
        tiny_loader().dataset, batch_size=16, shuffle=shuffle, generator=torch.Generator().manual_seed(0)
    )
    return tiny_setup().evolve(loaders={"train": loader})


def _other_head() -> xp.TrainingSetup:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def _two_groups() -> xp.TrainingSetup:
    model = tiny_model()
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters()}]
    return xp.TrainingSetup(model, torch.optim.SGD(groups, lr=0.1, momentum=0.9))


CHECKPOINT_SAFETY: list[Case] = [
    Case(
        "ckpt-extra-numpy-scalar",
        "checkpoint.save(path, run, step=1, extra={'lr': np.float64(1e-3)})",
        lambda: _save_extra({"lr": np.float64(1e-3)}),
        TypeError,
        "extra['lr'] is of type numpy.float64, which checkpoint.load cannot read back",
    ),
    Case(
        "ckpt-extra-numpy-array",
        "checkpoint.save(path, run, step=1, extra={'seen': np.arange(3)})",
        lambda: _save_extra({"seen": np.arange(3)}),
        TypeError,
        "torch.from_numpy(value) or value.tolist()",
    ),
    Case(
        "ckpt-extra-datetime",
        "checkpoint.save(path, run, step=1, extra={'at': datetime.now()})",
        lambda: _save_extra({"at": datetime.datetime(2024, 5, 1)}),
        TypeError,
        "Store a string (value.isoformat())",
    ),
    Case(
        "ckpt-extra-path",
        "checkpoint.save(path, run, step=1, extra={'out': pathlib.Path('runs')})",
        lambda: _save_extra({"out": pathlib.Path("runs")}),
        TypeError,
        "Store a string (str(value))",
    ),
    Case(
        "ckpt-extra-namespace",
        "checkpoint.save(path, run, step=1, extra={'args': parser.parse_args()})",
        lambda: _save_extra({"args": argparse.Namespace(lr=0.1)}),
        TypeError,
        "Store a dict (vars(value))",
    ),
    Case(
        "ckpt-extra-not-dict",
        "checkpoint.save(path, run, step=1, extra=[1, 2])",
        lambda: _save_extra([1, 2]),
        TypeError,
        "extra must be a dict of plain data",
    ),
    Case(
        "ckpt-format-only",
        "checkpoint.load(path) of torch.save({'format': checkpoint.FORMAT}, path)",
        lambda: checkpoint.load(_file("format-only.pt", obj={"format": checkpoint.FORMAT})),
        ValueError,
        "is not a whole xlapipe checkpoint: it lacks digest, step, run, model",
    ),
    Case(
        "ckpt-format-1",
        "checkpoint.load(path) of a checkpoint written by xlapipe before format 2",
        lambda: checkpoint.load(_file("v1.pt", obj={"format": "xlapipe-checkpoint/1", "step": 1})),
        ValueError,
        "was written by an earlier xlapipe (format 'xlapipe-checkpoint/1')",
    ),
    Case(
        "ckpt-flipped-byte",
        "checkpoint.load(path) of a checkpoint with a bit flipped inside a weight",
        lambda: checkpoint.load(_damaged("flipped.pt")),
        ValueError,
        "is damaged: its model part does not match the digest written with it",
    ),
    Case(
        "ckpt-optimizer-class",
        "checkpoint.restore(path, run) of an SGD run's checkpoint into an AdamW run",
        lambda: _restore_into(tiny_setup("adamw"), _saved("sgd.pt")),
        ValueError,
        "holds the state of a torch.optim.sgd.SGD optimizer and this run's optimizer is a "
        "torch.optim.adamw.AdamW",
    ),
    Case(
        "ckpt-shapes",
        "checkpoint.restore(path, run) into a run whose last layer has 3 outputs, not 2",
        lambda: _restore_into(_other_head(), _saved("tiny.pt")),
        ValueError,
        "other shapes: 2.weight: (2, 16) saved, (3, 16) here",
    ),
    Case(
        "ckpt-param-groups",
        "checkpoint.restore(path, run) into a run whose optimizer has two parameter groups",
        lambda: _restore_into(_two_groups(), _saved("tiny.pt")),
        ValueError,
        "optimizer has parameter groups of [4] parameters and this run's has [2, 2]",
    ),
    Case(
        "ckpt-loader-generator",
        "checkpoint.restore(path, run) into a run whose loader now has generator=g",
        lambda: _restore_into(_own_generator(shuffle=False), _saved("tiny.pt")),
        ValueError,
        "Build the loaders as the saving run did",
    ),
    Case(
        "ckpt-loader-changed",
        "checkpoint.restore(path, run) into a run whose loader now shuffles",
        lambda: _restore_into(_own_generator(shuffle=True), _saved("tiny.pt")),
        ValueError,
        "its sampler was 'SequentialSampler' and is 'RandomSampler' in this run",
    ),
]
