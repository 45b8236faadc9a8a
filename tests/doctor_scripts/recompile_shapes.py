"""Planted: batches padded to their longest sequence, so every step has new input shapes."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer, loader = tiny.sequence_model_and_loader(device)
for ids, y in loader:
    ids, y = ids.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(ids), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()  # FAULT: recompile
print("done")
