"""Planted, two together: batches padded to their longest, and the loss read before the step marker."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer, loader = tiny.sequence_model_and_loader(device)
losses = []
for ids, y in loader:
    ids, y = ids.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(ids), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(loss))  # FAULT: host_read
    torch_xla.sync()  # FAULT: recompile
print("done", sum(losses) / len(losses))
