"""Planted: the loss read on the host inside every step, before the step marker."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
total = 0.0
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.item()  # FAULT: host_read
    torch_xla.sync()
print(f"mean loss {total / 10:.4f}")
