"""Planted: a median over the batch, which torch_xla runs on the CPU, in every step (an xlapipe script)."""

import tiny
import torch

import xlapipe as xp


def loss_fn(model, batch):
    x, y = batch
    logits = model(x)
    center = logits.median(dim=0).values  # FAULT: cpu_fallback
    return torch.nn.functional.cross_entropy(logits - center, y)


model, optimizer = tiny.model_and_optimizer()
setup = xp.TrainingSetup(model, optimizer, {"train": tiny.loader()})
with xp.session(xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done")
