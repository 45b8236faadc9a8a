"""No fault: recompile_index.py with the doctor's fix: the schedule's index kept on the device."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
sigmas = torch.linspace(1.0, 0.1, 50, device=device)
i = torch.zeros(1, dtype=torch.long, device=device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    sigma = sigmas.index_select(0, i)
    loss = torch.nn.functional.cross_entropy(model(x + sigma * torch.randn_like(x)), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    i += 1
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
