"""Planted: a torch_xla script with no step marker: every step is traced into one growing graph."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # FAULT: step_marker
    optimizer.zero_grad()
print(f"final loss {loss.item():.4f}")
