"""Planted: torch.cdist in the forward pass (distances to learned prototypes); XLA lowers its forward,
not its backward (_cdist_backward runs on the CPU)."""

import tiny
import torch
import torch_xla
from torch import nn


class Prototypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.centres = nn.Linear(8, 4), nn.Parameter(torch.randn(2, 4))

    def forward(self, x):
        return -torch.cdist(self.embed(x), self.centres)  # FAULT: cpu_fallback


device = torch_xla.device()
torch.manual_seed(0)
model = Prototypes().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
