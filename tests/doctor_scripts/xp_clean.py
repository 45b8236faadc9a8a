"""No fault: a script built on xlapipe, with the device loader."""

import tiny
import torch

import xlapipe as xp


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


model, optimizer = tiny.model_and_optimizer()
setup = xp.TrainingSetup(model, optimizer, {"train": tiny.loader()})
pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
with xp.session(pipeline(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done", run.steps)
