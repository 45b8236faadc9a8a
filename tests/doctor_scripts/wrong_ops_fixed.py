"""The fixes of wrong_ops.py, as the doctor words them: the same numbers as eager PyTorch, on XLA."""

import tiny
import torch
import torch_xla
from torch import nn

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)


def scaled(n, s):
    return nn.functional.interpolate(torch.eye(n)[None, None], scale_factor=(1, s))[0, 0].T.to(device)


rows, cols = scaled(2, 0.6), scaled(4, 0.6)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    x = x / x.abs().amax(dim=tuple(range(x.dim())))
    logits = model(x)
    spread = (logits - logits.mean()).pow(2).mean()
    loss = torch.nn.functional.cross_entropy(logits, y) + 1e-3 * spread
    image = x.view(-1, 1, 2, 4)
    smaller = rows @ image @ cols.T
    block = x.view(4, 4, 8)
    trace = torch.diagonal(block.movedim((0, 1), (-2, -1)), 0, -2, -1).sum()
    loss = loss + 1e-3 * (smaller.sum() + trace)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
