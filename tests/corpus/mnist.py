"""torch_xla's ``test/test_train_mp_mnist.py``, ported to xlapipe.

Upstream: https://github.com/pytorch/xla, ``test/test_train_mp_mnist.py`` at commit
41398bfff334fc8d3b1c00be6ea8cc5411f6d6bf (BSD-3-Clause, (c) the PyTorch/XLA authors).

What the port keeps: ``torch.manual_seed(1)`` first; the convolutional model with
batch normalisation (its running statistics are buffers a checkpoint must
carry), log-softmax and ``NLLLoss``; SGD with momentum 0.5 at ``lr *
world_size``; a training ``DataLoader`` shuffled by torch's global generator
(``shuffle=True``, no generator of its own) and a test one; its
``MpDeviceLoader`` loop (``wrap_loader_mp``; without it, the plain lazy loop);
``optimizer.zero_grad(); loss.backward(); xm.optimizer_step(optimizer)`` per
batch (one replica here: ``optimizer.step()``); its training update every
``log_steps`` steps through ``xm.add_step_closure`` (``log_every(log_steps,
to=train_update)``: it numbers the steps from 1 across epochs where the script
numbers them from 0 within each epoch); the accuracy on the test set after each epoch.

Added, since the script has none: a checkpoint at step ``checkpoint_step``
(inside an epoch), and a resume from it; an average of the weights kept by hand
(eager) where the port lists ``ema``. Left out: the MNIST download
(``train_size`` random 28x28 images with random labels), DDP,
``xm.mesh_reduce`` (one replica), the summary writer.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import xlapipe as xp
from corpus.common import Average, Result, cpu_state, option
from xlapipe import checkpoint


class MNIST(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.bn1 = nn.BatchNorm2d(10)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.bn2 = nn.BatchNorm2d(20)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(F.relu(F.max_pool2d(self.conv1(x), 2)))
        x = self.bn2(F.relu(F.max_pool2d(self.conv2(x), 2)))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


@dataclass(frozen=True)
class Flags:
    batch_size: int = 16  # 128 upstream
    momentum: float = 0.5
    lr: float = 0.01
    num_epochs: int = 2  # 18
    log_steps: int = 2  # 20
    drop_last: bool = False
    num_workers: int = 0
    # Not the script's: the data's size, a checkpoint inside epoch 2 (after its 2nd batch of 5),
    # the run to resume from, a stop right after the save (a crash), an average kept by hand.
    train_size: int = 80
    test_size: int = 32
    out_dir: str = "out"
    checkpoint_step: int | None = 7
    resume_from: str | None = None
    stop_after_save: bool = False
    ema_decay: float | None = None


FOLDER = "out_dir"  # the option naming the folder its checkpoints go to


def args_for(pipeline: xp.Pipeline, **overrides) -> Flags:
    return Flags(ema_decay=option(pipeline, "ema", "decay"), **overrides)


def without_checkpoints(flags: Flags) -> Flags:
    return dataclasses.replace(flags, checkpoint_step=None)


def interrupted(flags: Flags, folder: str) -> Flags:
    """The run that crashes right after writing its checkpoint into ``folder``."""
    return dataclasses.replace(flags, out_dir=folder, stop_after_save=True)


def resumed(flags: Flags, folder: str) -> Flags:
    """The script started again from that checkpoint."""
    return dataclasses.replace(flags, out_dir=folder, resume_from=os.path.join(folder, "mnist.pt"))


def resume_point(flags: Flags) -> int:
    assert flags.checkpoint_step is not None
    return flags.checkpoint_step


LOG: list[dict[str, Any]] = []


def train_update(record: dict[str, Any]) -> None:
    """The script's ``_train_update`` (printing the step, loss and rate): here the record is kept."""
    LOG.append(record)


def datasets(flags: Flags):
    g = torch.Generator().manual_seed(0)  # the images' own generator: the global one stays the script's

    def images(n: int) -> torch.utils.data.TensorDataset:
        return torch.utils.data.TensorDataset(
            torch.randn(n, 1, 28, 28, generator=g), torch.randint(10, (n,), generator=g)
        )

    return images(flags.train_size), images(flags.test_size)


def build(flags: Flags):
    torch.manual_seed(1)
    train_dataset, test_dataset = datasets(flags)
    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=flags.batch_size,
        sampler=None,
        drop_last=flags.drop_last,
        shuffle=True,
        num_workers=flags.num_workers,
    )
    test_loader = torch.utils.data.DataLoader(
        test_dataset,
        batch_size=flags.batch_size,
        drop_last=flags.drop_last,
        shuffle=False,
        num_workers=flags.num_workers,
    )
    lr = flags.lr * 1  # * xr.world_size(): one replica
    model = MNIST()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=flags.momentum)
    return model, optimizer, train_loader, test_loader


# -- the script, eager ----------------------------------------------------------------------------


def eager(flags: Flags) -> Result:
    model, optimizer, train_loader, test_loader = build(flags)
    loss_fn = nn.NLLLoss()
    average = Average(model, flags.ema_decay) if flags.ema_decay else None
    result = Result([], {})
    for _epoch in range(1, flags.num_epochs + 1):
        model.train()
        for step, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = loss_fn(output, target)
            loss.backward()
            optimizer.step()
            if average is not None:
                average.update(model)
            result.losses.append(loss.item())
            if step % flags.log_steps == 0:
                result.logged.append({"loss": loss.item()})
            if len(result.losses) == flags.checkpoint_step:  # the checkpoint the port adds, here too
                os.makedirs(flags.out_dir, exist_ok=True)
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, os.path.join(flags.out_dir, "eager.pt"))
                result.saves.append(len(result.losses))
        model.eval()
        correct = total_samples = 0
        with torch.no_grad():
            for data, target in test_loader:
                pred = model(data).max(1, keepdim=True)[1]
                correct += int(pred.eq(target.view_as(pred)).sum())
                total_samples += data.size()[0]
        result.evals.append(100.0 * correct / total_samples)
    result.weights = cpu_state(model)
    result.average = average.average if average is not None else None
    return result


# -- the script, ported ---------------------------------------------------------------------------


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    data, target = batch
    return F.nll_loss(model(data), target)


def ported(pipeline: xp.Pipeline, flags: Flags) -> Result:
    model, optimizer, train_loader, test_loader = build(flags)
    setup = xp.TrainingSetup(model, optimizer, {"train": train_loader, "test": test_loader})
    result = Result([], {})
    losses = []
    del LOG[:]
    path = os.path.join(flags.out_dir, "mnist.pt")
    with xp.session(pipeline(setup)) as run:
        if flags.resume_from:
            checkpoint.restore(flags.resume_from, run)
        stopped = False
        for _epoch in range(run.epoch + 1, flags.num_epochs + 1):
            for batch in run.batches("train"):
                losses.append(run.step(batch, loss_fn))
                if run.steps == flags.checkpoint_step:
                    os.makedirs(flags.out_dir, exist_ok=True)
                    checkpoint.save(path, run, step=run.steps)
                    result.saves.append(run.steps)
                    if flags.stop_after_save:
                        stopped = True
                        break
            if stopped:
                break
            correct, total_samples = 0, 0
            with run.evaluating():
                for data, target in run.batches("test"):
                    pred = run.model(data).max(1, keepdim=True)[1]
                    correct += pred.eq(target.view_as(pred)).sum()
                    total_samples += data.size()[0]
            result.evals.append(100.0 * float(correct) / total_samples)
        result.losses = [float(v) for v in losses]
        result.weights = run.state_dict()
        if flags.ema_decay:
            result.average = xp.averaged_weights(run)
    result.logged = list(LOG)
    return result
