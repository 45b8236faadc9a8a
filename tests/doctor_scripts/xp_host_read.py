"""Planted: the loss function reads the loss on the host, in every step (an xlapipe script)."""

import tiny
import torch

import xlapipe as xp

seen = []


def loss_fn(model, batch):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y)
    seen.append(float(loss))  # FAULT: host_read
    return loss


model, optimizer = tiny.model_and_optimizer()
setup = xp.TrainingSetup(model, optimizer, {"train": tiny.loader()})
with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done", len(seen))
