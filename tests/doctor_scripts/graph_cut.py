"""Planted: a second step marker between backward and the update, which cuts every step's graph in two."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch_xla.sync()  # FAULT: executions
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
