"""No fault: a script built on xlapipe whose step torch.compile compiles (the graphs it runs are by design)."""

import tiny
import torch

import xlapipe as xp


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


model, optimizer = tiny.model_and_optimizer()
setup = xp.TrainingSetup(model, optimizer, {"train": tiny.loader()})
with xp.session(xp.Pipeline(xp.with_device(), xp.compile_step())(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done")
