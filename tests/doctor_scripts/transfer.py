"""Planted: class weights built on the host and copied to the device in every step."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for x, y in tiny.loader():
    x, y = x.to(device), y.to(device)
    weight = torch.tensor([1.0, 2.0]).to(device)  # FAULT: executions
    loss = torch.nn.functional.cross_entropy(model(x), y, weight=weight)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
