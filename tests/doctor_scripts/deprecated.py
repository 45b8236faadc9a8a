"""Planted: torch's deprecated default tensor type, and torch_xla's deprecated step marker."""

import tiny
import torch
import torch_xla
import torch_xla.core.xla_model as xm

torch.set_default_tensor_type(torch.FloatTensor)  # FAULT: setup
device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    xm.mark_step()  # FAULT: setup
print("done")
