"""Planted, two together: class weights by torch.bincount (CPU) and the loss printed inside the step."""

import tiny
import torch

import xlapipe as xp


def loss_fn(model, batch):
    x, y = batch
    counts = torch.bincount(y, minlength=2).float()  # FAULT: cpu_fallback
    loss = torch.nn.functional.cross_entropy(model(x), y, weight=counts.sum() / (2 * counts.clamp(min=1)))
    print(f"loss {loss:.4f}")  # FAULT: host_read
    return loss


model, optimizer = tiny.model_and_optimizer()
setup = xp.TrainingSetup(model, optimizer, {"train": tiny.loader()})
with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done")
