"""Planted: torch_xla's step API with the loss read on the host inside the step."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
losses = []
for x, y in tiny.loader():
    with torch_xla.step():
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())  # FAULT: host_read
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
print(f"mean loss {sum(losses) / len(losses):.4f}")
