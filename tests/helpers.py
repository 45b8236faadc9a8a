"""Tiny workloads and reference loops shared by the tests."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import xlapipe as xp


def tiny_loader(n: int = 64, batch_size: int = 16, seed: int = 1) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x.sum(1) > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def tiny_setup(optimizer: str = "sgd", seed: int = 0, **kwargs) -> xp.TrainingSetup:
    model = tiny_model(seed)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2)
    )
    return xp.TrainingSetup(model, opt, {"train": tiny_loader()}, **kwargs)


def train_losses(setup: xp.TrainingSetup, epochs: int = 1) -> list[float]:
    with xp.session(setup) as run:
        losses = []
        for _ in range(epochs):
            losses += [run.step(b, loss_fn) for b in run.loaders["train"]]
        return [float(v) for v in losses]


def eager_losses(optimizer: str = "sgd", epochs: int = 1) -> list[float]:
    """The plain PyTorch loop on CPU, written by hand: the reference."""
    setup = tiny_setup(optimizer)
    model, opt = setup.model, setup.optimizer
    losses = []
    for _ in range(epochs):
        for batch in setup.loaders["train"]:
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
