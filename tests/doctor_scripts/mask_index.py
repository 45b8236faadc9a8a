"""Planted: the loss over the rows a boolean mask keeps (x[mask]): a shape that depends on the data.

The batch size never changes (drop_last=True); the rows kept do, every step.
"""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
loader = tiny.loader(n=176, batch_size=16)
loader = torch.utils.data.DataLoader(loader.dataset, batch_size=16, drop_last=True)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    logits = model(x)
    keep = x[:, 0] > 0
    loss = torch.nn.functional.cross_entropy(logits[keep], y[keep])  # FAULT: recompile, cpu_fallback
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
