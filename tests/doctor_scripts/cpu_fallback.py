"""Planted: class weights counted with torch.bincount, which runs on the CPU, in every step."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    counts = torch.bincount(y, minlength=2).float()  # FAULT: cpu_fallback
    weight = counts.sum() / (2 * counts.clamp(min=1))
    loss = torch.nn.functional.cross_entropy(model(x), y, weight=weight)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
