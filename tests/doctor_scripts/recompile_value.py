"""Planted: the step number, a Python int, is baked into the graph (torch.roll's shift)."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for step, (x, y) in enumerate(tiny.loader()):
    x, y = x.to(device), y.to(device)
    x = torch.roll(x, shifts=step, dims=1)  # FAULT: recompile
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
