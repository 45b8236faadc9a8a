"""Checkpoints: a resumed run follows the uninterrupted one; a killed save loses nothing."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch
import torch_xla.core.xla_model as xm
from torch import nn

import xlapipe as xp
from helpers import loss_fn
from xlapipe import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


def dropout_setup(model_seed: int = 0) -> xp.TrainingSetup:
    """Every generator matters: dropout (XLA), shuffling (torch CPU), AdamW + a schedule."""
    torch.manual_seed(model_seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
    return pipeline(xp.TrainingSetup(model, opt, {"train": loader}))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    xm.set_rng_state(seed)


def epoch(run: xp.Run, scheduler) -> list[float]:
    losses = []
    for batch in run.loaders["train"]:
        losses.append(float(run.step(batch, loss_fn)))
        scheduler.step()
    # The host generators feed the next epoch too (python and numpy draws here).
    return losses + [random.random(), float(np.random.rand())]


def schedule(run: xp.Run):
    return torch.optim.lr_scheduler.StepLR(run.optimizer, step_size=2, gamma=0.5)


def test_resumed_run_follows_the_uninterrupted_one(tmp_path):
    seed_everything(7)
    with xp.session(dropout_setup()) as run:
        sched = schedule(run)
        straight = [epoch(run, sched) for _ in range(3)]

    path = tmp_path / "ckpt.pt"
    seed_everything(7)
    with xp.session(dropout_setup()) as run:
        sched = schedule(run)
        first = epoch(run, sched)
        assert checkpoint.save(path, run, step=3, scheduler=sched, extra={"epoch": 1}) is True

    seed_everything(12345)  # a fresh process would start elsewhere: restore must put it back
    with xp.session(dropout_setup(model_seed=99)) as run:
        sched = schedule(run)
        step = checkpoint.restore(path, run, scheduler=sched)
        rest = [epoch(run, sched) for _ in range(2)]

    assert step == 3 and checkpoint.load(path)["extra"] == {"epoch": 1}
    assert first == straight[0]
    resumed = [v for e in rest for v in e]
    want = [v for e in straight[1:] for v in e]
    assert len(resumed) == len(want) == 10
    # Same graphs on the same device: equal to float32 rounding.
    np.testing.assert_allclose(resumed, want, rtol=1e-6, atol=0)
    # ...and the restore mattered: from the scrambled state the run goes elsewhere.
    seed_everything(12345)
    with xp.session(dropout_setup(model_seed=99)) as run:
        sched = schedule(run)
        astray = epoch(run, sched)
    assert not np.allclose(astray, want[:5], rtol=1e-3)


def test_checkpoint_tensors_are_on_cpu_and_optimizer_stays_bound(tmp_path):
    seed_everything(0)
    path = tmp_path / "c.pt"
    with xp.session(dropout_setup()) as run:
        sched = schedule(run)
        epoch(run, sched)
        checkpoint.save(path, run, step=1, scheduler=sched)
        state = checkpoint.load(path)
        before = [p for p in run.model.parameters()]
        checkpoint.restore(path, run, scheduler=sched)
        assert [p for p in run.model.parameters()] == before
        bound = {id(p) for g in run.optimizer.param_groups for p in g["params"]}
        assert bound == {id(p) for p in run.model.parameters()}
        assert run.model[0].weight.device.type == "xla"
    tensors = [v for v in state["model"].values()] + [
        t for s in state["optimizer"]["state"].values() for t in s.values() if torch.is_tensor(t)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert isinstance(state["rng"]["xla"], int)


KILLED_SAVE = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, {here!r})
    import xlapipe as xp
    from xlapipe import checkpoint
    from helpers import tiny_setup
    path = sys.argv[1]
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        checkpoint.save(path, run, step=1)
        blob = torch.ones(256 * 1024 * 1024 // 4 * {mb_quarter})  # large: the write takes a while
        print("saving", flush=True)
        checkpoint.save(path, run, step=2, extra={{"blob": blob}})
        print("saved", flush=True)
""")


def test_kill_during_save_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "ckpt.pt"
    script = KILLED_SAVE.format(here=HERE, mb_quarter=4)  # 1 GiB
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().strip() == "saving"
        partial = []
        while child.poll() is None and not partial:  # wait for the temporary file to fill
            partial = [p for p in tmp_path.iterdir()
                       if p.name.endswith(".tmp") and p.stat().st_size > 16 * 2**20]
            time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert partial, "the save finished before it could be interrupted; use a larger blob"
    assert child.returncode == -signal.SIGKILL
    assert partial[0].exists()  # killed mid-write: the temporary file is left, unfinished
    state = checkpoint.load(path)  # ...and the checkpoint is the previous one, whole
    assert state["step"] == 1 and "blob" not in state["extra"]
    assert set(state["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_a_save_between_two_steps_resumes_mid_epoch(tmp_path):
    """Saved right after a step (its graph still pending), not at an epoch's end."""
    def ordered(model_seed=0, skip=0):
        setup = dropout_setup(model_seed)
        data = setup.loaders["train"].loader.dataset
        rest = torch.utils.data.Subset(data, range(skip, len(data)))
        plain = torch.utils.data.DataLoader(rest, batch_size=8)  # in order, 6 batches unskipped
        return xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(
            xp.TrainingSetup(setup.model, setup.optimizer, {"train": plain}))

    seed_everything(3)
    with xp.session(ordered()) as run:
        straight = [float(run.step(b, loss_fn)) for b in run.loaders["train"]]
    path = tmp_path / "mid.pt"
    seed_everything(3)
    with xp.session(ordered()) as run:
        saving = []
        for i, batch in enumerate(run.loaders["train"]):
            saving.append(float(run.step(batch, loss_fn)))
            if i == 2:
                checkpoint.save(path, run, step=3)
    assert saving == straight  # saving changes nothing in the run that saves
    seed_everything(999)
    # The loader's position is the caller's to restore, on the host side: every
    # batch a device loader hands out ends a step and moves the XLA generator on.
    with xp.session(ordered(model_seed=5, skip=3 * 8)) as run:
        assert checkpoint.restore(path, run) == 3
        rest = [float(run.step(b, loss_fn)) for b in run.loaders["train"]]
    np.testing.assert_allclose(rest, straight[3:], rtol=1e-6, atol=0)
