"""Planted: a noise schedule indexed by the Python step number (diffusers' `sigmas[step_index]`)."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
sigmas = torch.linspace(1.0, 0.1, 50, device=device)
for step_index, (x, y) in enumerate(tiny.loader()):
    x, y = x.to(device), y.to(device)
    sigma = sigmas[step_index]  # FAULT: recompile
    loss = torch.nn.functional.cross_entropy(model(x + sigma * torch.randn_like(x)), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
