"""Planted: a bilinear upsampling in the forward pass; XLA lowers it, and its backward runs on the CPU."""

import tiny
import torch
import torch_xla
from torch import nn


class Upsampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(64, 2)

    def forward(self, x):
        image = self.up(x).view(-1, 1, 4, 4)
        bigger = nn.functional.interpolate(image, size=(8, 8), mode="bilinear")  # FAULT: cpu_fallback
        return self.down(bigger.flatten(1))


device = torch_xla.device()
torch.manual_seed(0)
model = Upsampler().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
