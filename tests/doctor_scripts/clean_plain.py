"""No fault: a plain torch_xla loop, as torch_xla's docs write it."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
