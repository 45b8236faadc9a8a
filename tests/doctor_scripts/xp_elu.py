"""No fault: wrong_gradient.py's elu and max-norm penalty in an xlapipe session, whose with_device corrects both."""

import tiny
import torch
from torch import nn

import xlapipe as xp


def loss_fn(model, batch):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y)
    return loss + 1e-3 * model[0].weight.norm(p=float("inf"))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ELU(), nn.Linear(16, 16), nn.SELU(), nn.Linear(16, 2))
setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny.loader()})
pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
with xp.session(pipeline(setup)) as run:
    for batch in run.batches("train"):
        run.step(batch, loss_fn)
print("done", run.steps)
