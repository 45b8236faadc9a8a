"""Planted: no step marker, and the optimizer built before model.to(device): both found, the silent one first."""

import tiny
import torch
import torch_xla
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # FAULT: optimizer
device = torch_xla.device()
model = model.to(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # FAULT: step_marker
    optimizer.zero_grad()
print(f"final loss {loss.item():.4f}")
