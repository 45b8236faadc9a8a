"""Planted: calls torch_xla 2.9 computes wrong, silently (each found by the public OpInfo sweep of the ops)."""

import tiny
import torch
import torch_xla
from torch import nn

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    x = x / x.abs().amax()  # FAULT: wrong_result
    logits = model(x)
    spread = (logits - logits.mean(dim=())).pow(2).mean()  # FAULT: wrong_result
    loss = torch.nn.functional.cross_entropy(logits, y) + 1e-3 * spread
    image = x.view(-1, 1, 2, 4)
    smaller = nn.functional.interpolate(image, scale_factor=0.6)  # FAULT: wrong_result
    block = x.view(4, 4, 8)
    trace = torch.diagonal(block).sum()  # FAULT: wrong_result
    loss = loss + 1e-3 * (smaller.sum() + trace)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
