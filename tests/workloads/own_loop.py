"""A training script written with no thought of xlapipe ablate: no --pipeline, no --report, no timer.

It reads its own flags, builds a small classifier and its data, chooses its
practices (with a log function of its own, defined here), sets a scheduler
after applying its pipeline, trains in xp.session and prints the accuracy.
``xlapipe ablate tests/workloads/own_loop.py -- --label mine`` runs it as it is.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import xlapipe as xp

LABEL = "unset"  # set from the flags: a copy of this module imported a second time would say "unset"


def show(record: dict) -> None:
    """The script's own log line."""
    print(f"log [{LABEL}] step {record['step']} loss {record['loss']:.4f} lr {record['lr']:.4g}", flush=True)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :4].sum(1) > 0).long())


def main() -> None:
    global LABEL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="unset")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    LABEL = args.label

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    loaders = {
        "train": torch.utils.data.DataLoader(data(192, 1), batch_size=16),
        "eval": torch.utils.data.DataLoader(data(64, 2), batch_size=16),
    }
    pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), xp.log_every(4, to=show))
    setup = pipeline(xp.TrainingSetup(model, lambda ps: torch.optim.SGD(ps, lr=0.05), loaders))
    setup = setup.evolve(scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.1))
    with xp.session(setup) as run:
        for _ in range(args.epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        correct, total = [], 0
        with run.evaluating():
            for x, y in run.batches("eval"):
                correct.append((run.model(x).argmax(-1) == y).sum())
                total += len(y)
        print(f"accuracy: {float(torch.stack(correct).sum()) / total:.4f}", flush=True)


if __name__ == "__main__":
    main()
