"""Planted: F.glu in the forward pass; its backward (glu_backward) has no XLA lowering and runs on the CPU."""

import tiny
import torch
import torch_xla
from torch import nn


class GluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(16, 2)

    def forward(self, x):
        return self.down(nn.functional.glu(self.up(x), dim=-1))  # FAULT: cpu_fallback


device = torch_xla.device()
torch.manual_seed(0)
model = GluNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
