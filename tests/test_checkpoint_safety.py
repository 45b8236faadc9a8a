"""Checkpoints lose nothing and resume nothing wrong: what they refuse, what they detect, what they clean."""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import random
import subprocess
import sys
import textwrap
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup
from xlapipe import checkpoint, checkpoint_file

HERE = os.path.dirname(os.path.abspath(__file__))


def device_setup(setup: xp.TrainingSetup | None = None) -> xp.TrainingSetup:
    return xp.Pipeline(xp.with_device())(setup or tiny_setup())


def trained_checkpoint(path, steps: int = 2, **save) -> None:
    with xp.session(device_setup()) as run:
        for batch in list(run.loaders["train"])[:steps]:
            run.step(batch, loss_fn)
        checkpoint.save(path, run, step=steps, **save)


def weights(run: xp.Run) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}


def temporaries(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


# -- extra: what cannot be read back is refused, and the good file stays -------------------------


@pytest.mark.parametrize(
    "value, fix",
    [
        (np.float64(0.5), "value.item()"),
        (np.int64(3), "value.item()"),
        (np.ones(3), "torch.from_numpy(value)"),
        (datetime.datetime(2024, 5, 1, 12, 0), "value.isoformat()"),
        (pathlib.Path("runs/a"), "str(value)"),
        (argparse.Namespace(lr=0.1), "vars(value)"),
    ],
)
def test_extra_that_cannot_load_back_is_refused_and_the_last_good_checkpoint_stays(tmp_path, value, fix):
    path = tmp_path / "ckpt.pt"
    trained_checkpoint(path, extra={"note": "good"})
    before = path.read_bytes()
    with xp.session(device_setup()) as run:
        with pytest.raises(TypeError, match=r"extra\['config'\]\['value'\] is of type .*cannot read") as info:
            checkpoint.save(path, run, step=9, extra={"config": {"value": value}})
    assert fix in str(info.value) and "the previous checkpoint is kept" in str(info.value)
    assert path.read_bytes() == before and temporaries(tmp_path) == []
    assert checkpoint.load(path)["extra"] == {"note": "good"}


def test_plain_data_of_every_kind_round_trips_also_in_another_process(tmp_path):
    path = tmp_path / "ckpt.pt"
    extra = {
        "epoch": 3,
        "lr": 1e-3,
        "done": False,
        "none": None,
        "z": 1 + 2j,
        "name": "bert",
        "raw": b"\x00\xff",
        "tags": {"alpha", "beta", "gamma", "delta"},  # a set's order depends on the process's hash seed
        "history": [0.5, 0.25],
        "pair": (1, "a"),
        "ordered": OrderedDict(b=1, a=2),
        "tensor": torch.arange(6.0).reshape(2, 3),
        "half": torch.ones(2, dtype=torch.bfloat16),
        "dtype": torch.float16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        7: "int key",
    }
    trained_checkpoint(path, extra=extra)
    got = checkpoint.load(path)["extra"]
    assert set(got) == set(extra) and got["tags"] == extra["tags"]
    assert torch.equal(got["tensor"], extra["tensor"]) and got["half"].dtype == torch.bfloat16
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.dirname(HERE)!r})
        from xlapipe import checkpoint
        print(sorted(checkpoint.load({str(path)!r})["extra"]["tags"]))
    """)
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PJRT_DEVICE": "CPU"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['alpha', 'beta', 'delta', 'gamma']"


def test_extra_must_be_a_mapping(tmp_path):
    with xp.session(device_setup()) as run, pytest.raises(TypeError, match="extra must be a dict"):
        checkpoint.save(tmp_path / "c.pt", run, step=1, extra=[1, 2])


def test_a_written_file_is_checked_before_it_replaces_the_old_one(tmp_path):
    path = tmp_path / "ckpt.pt"
    trained_checkpoint(path)
    before = path.read_bytes()

    def refuse(written: str) -> None:
        assert os.path.exists(written) and written != str(path)
        raise RuntimeError("does not read back")

    with pytest.raises(RuntimeError, match="does not read back"):
        checkpoint_file.write_atomic({"anything": 1}, path, check=refuse)
    assert path.read_bytes() == before and temporaries(tmp_path) == []
    # ...and the check save uses refuses a file cut short, or without all its parts:
    short = tmp_path / "short.pt"
    short.write_bytes(before[: len(before) // 2])
    with pytest.raises(RuntimeError, match="does not read back .*the previous checkpoint is kept"):
        checkpoint._check_written(str(short), path)
    torch.save({"format": checkpoint.FORMAT, "step": 1}, short)
    with pytest.raises(RuntimeError, match="does not read back .*not a whole xlapipe checkpoint"):
        checkpoint._check_written(str(short), path)


# -- flipped bytes --------------------------------------------------------------------------------


def weight_offset(path) -> int:
    """Where the bytes of the model's first weight are in the file (torch stores tensors' bytes raw)."""
    needle = checkpoint.load(path)["model"]["0.weight"].numpy().tobytes()
    data = pathlib.Path(path).read_bytes()
    assert data.count(needle) == 1
    return data.find(needle)


def flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x10]) + data[offset + 1 :]


def test_a_flipped_byte_in_a_tensor_is_detected_and_named(tmp_path):
    path = tmp_path / "ckpt.pt"
    trained_checkpoint(path)
    offset = weight_offset(path) + 7
    path.write_bytes(flip(path.read_bytes(), offset))
    assert torch.load(path, weights_only=True)["step"] == 2  # torch itself reads it without a word
    with pytest.raises(
        ValueError,
        match=r"ckpt.pt' is damaged: its model part does not match "
        r"the digest.*use an earlier checkpoint",
    ):
        checkpoint.load(path)
    with xp.session(device_setup()) as run:
        before = weights(run)
        with pytest.raises(ValueError, match="is damaged"):
            checkpoint.restore(path, run)
        assert all(torch.equal(before[k], v) for k, v in weights(run).items())


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_no_flipped_byte_anywhere_gives_other_contents_silently(tmp_path):
    """Flip bytes all over the file: each load either refuses or returns exactly what was saved."""
    path = tmp_path / "ckpt.pt"
    trained_checkpoint(path, extra={"epoch": 1})
    good, saved = path.read_bytes(), checkpoint.load(path)
    rng = random.Random(0)
    refused = returned_same = 0
    for offset in sorted(rng.sample(range(len(good)), 60)) + [weight_offset(path) + 1]:
        path.write_bytes(flip(good, offset))
        try:
            state = checkpoint.load(path)
        except ValueError:
            refused += 1
            continue
        assert same(state, saved), f"byte {offset} of {len(good)} changed the contents silently"
        returned_same += 1
    assert refused >= 10, (refused, returned_same)


# -- restore checks everything before changing anything -----------------------------------------------


def other_head_setup() -> xp.TrainingSetup:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # 3 classes, not 2
    return device_setup(
        xp.TrainingSetup(
            model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), {"train": tiny_loader()}
        )
    )


def two_group_setup() -> xp.TrainingSetup:
    model = tiny_model(4)
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.01}]
    return device_setup(
        xp.TrainingSetup(model, torch.optim.SGD(groups, lr=0.1, momentum=0.9), {"train": tiny_loader()})
    )


def generator_loader_setup() -> xp.TrainingSetup:
    data = tiny_loader().dataset
    loader = torch.utils.data.DataLoader(
        data, batch_size=16, generator=torch.Generator().manual_seed(0)
    )  # only the generator differs (a loader that shuffles now is refused by its sampler first)
    return device_setup(tiny_setup(seed=4).evolve(loaders={"train": loader}))


@pytest.mark.parametrize(
    "setup, match",
    [
        (
            other_head_setup,
            r"model does not fit this run's model \(other shapes: 2.weight: \(2, 16\) saved, "
            r"\(3, 16\)",
        ),
        (two_group_setup, r"parameter groups of \[4\] parameters and this run's has \[2, 2\]"),
        (
            lambda: device_setup(tiny_setup("adamw", seed=4)),
            r"a torch.optim.sgd.SGD optimizer and this run's",
        ),
        (
            generator_loader_setup,
            r"loader 'train': the checkpoint holds the random state of \[\] and this run's loader has "
            r"\['loader.generator'\]",
        ),
    ],
)
def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path, setup, match):
    path = tmp_path / "ckpt.pt"
    trained_checkpoint(path)
    with xp.session(setup()) as run:
        run.step(next(iter(run.loaders["train"])), loss_fn)  # optimizer state too
        before = weights(run)
        optimizer = {k: v.detach().cpu().clone() for s in run.optimizer.state.values() for k, v in s.items()}
        with pytest.raises(ValueError, match=match) as info:
            checkpoint.restore(path, run)
        assert "Nothing was changed" in str(info.value)
        assert all(torch.equal(before[k], v) for k, v in weights(run).items())
        after = {k: v.detach().cpu() for s in run.optimizer.state.values() for k, v in s.items()}
        assert set(after) == set(optimizer) and all(torch.equal(optimizer[k], after[k]) for k in after)
        assert run.steps == 1


def test_a_file_with_only_the_format_key_is_refused_by_name(tmp_path):
    path = tmp_path / "format-only.pt"
    torch.save({"format": checkpoint.FORMAT}, path)
    with pytest.raises(ValueError, match=r"is not a whole xlapipe checkpoint: it lacks digest, step, run"):
        checkpoint.load(path)


def test_format_1_files_are_refused_with_the_way_to_their_weights(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format": "xlapipe-checkpoint/1", "step": 1, "model": tiny_model().state_dict()}, path)
    with pytest.raises(
        ValueError, match=r"earlier xlapipe .*torch.load\(path, weights_only=True\)\['model'\]"
    ):
        checkpoint.load(path)


# -- the temporaries of killed saves ----------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_save_removes_stale_temporaries_and_only_those(tmp_path):
    host = checkpoint_file._HOST
    dead = dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "stale": f".ckpt.pt.xlapipe-{host}-{dead}-0123abcd.tmp",
            "other checkpoint, stale": f".best.pt.xlapipe-{host}-{dead}-89abcdef.tmp",
            "live writer": f".ckpt.pt.xlapipe-{host}-{sleeper.pid}-0123abcd.tmp",
            "live, another user's": f".ckpt.pt.xlapipe-{host}-1-0123abcd.tmp",  # init: os.kill says EPERM
            "other host": f".ckpt.pt.xlapipe-elsewhere_{host}-{dead}-0123abcd.tmp",
            "not ours": ".notes.tmp",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        trained_checkpoint(tmp_path / "ckpt.pt")
        left = set(os.listdir(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert names["stale"] not in left and names["other checkpoint, stale"] not in left
    kept = {"live writer", "live, another user's", "other host", "not ours"}
    assert {names[k] for k in kept} | {"ckpt.pt"} == left
    assert checkpoint.load(tmp_path / "ckpt.pt")["step"] == 2


def test_loaders_whose_randomness_a_checkpoint_cannot_hold_are_named(tmp_path):
    data = tiny_loader().dataset
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=1, persistent_workers=True)
    with xp.session(device_setup(tiny_setup().evolve(loaders={"train": loader}))) as run:
        with pytest.warns(RuntimeWarning, match="loader 'train' keeps persistent worker processes"):
            checkpoint.save(tmp_path / "c.pt", run, step=0)


def test_own_temporaries_are_named_for_the_cleanup():
    name = checkpoint_file.temporary_name("ckpt.pt")
    match = checkpoint_file._TEMPORARY.match(name)
    assert match and match["host"] == checkpoint_file._HOST and int(match["pid"]) == os.getpid()


# -- the optimizer factory ------------------------------------------------------------------------------


def test_an_optimizer_factory_must_return_an_optimizer_over_the_runs_parameters():
    model = tiny_model()
    with pytest.raises(TypeError, match="the optimizer factory returned a builtins.list, not a torch.optim"):
        with xp.session(device_setup(xp.TrainingSetup(model, lambda p: [torch.optim.SGD(p, lr=0.1)]))):
            pass
    mine = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="over 4 parameters that are not the run's"):
        with xp.session(device_setup(xp.TrainingSetup(model, lambda p: mine))):
            pass
