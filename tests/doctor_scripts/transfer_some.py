"""Planted: a shuffle index made on the CPU and copied to the device in most steps (3 in 5), not all."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
g = torch.Generator().manual_seed(2)
for step, (x, y) in enumerate(tiny.loader()):
    x, y = x.to(device), y.to(device)
    if step % 5 in (0, 2, 3):  # mix the rows of this batch
        perm = torch.randperm(16, generator=g).to(device)  # FAULT: executions
        x, y = x[perm], y[perm]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
