"""Planted: F.elu in the forward pass and a max-norm penalty, both computed wrong by torch_xla 2.9, silently."""

import tiny
import torch
import torch_xla
from torch import nn


class EluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 2)

    def forward(self, x):
        return self.down(nn.functional.elu(self.up(x)))  # FAULT: wrong_result


device = torch_xla.device()
torch.manual_seed(0)
model = EluNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss = loss + 1e-3 * model.up.weight.norm(p=float("inf"))  # FAULT: wrong_result
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
