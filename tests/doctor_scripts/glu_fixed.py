"""Control for glu_backward.py: glu written as chunk and sigmoid, which XLA lowers both ways."""

import tiny
import torch
import torch_xla
from torch import nn


class GluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(16, 2)

    def forward(self, x):
        a, b = self.up(x).chunk(2, dim=-1)
        return self.down(a * torch.sigmoid(b))


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
