"""Planted: no step marker at all; the loss printed every iteration is what runs each iteration's graph."""

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
    print(f"loss {loss.item():.4f}")
