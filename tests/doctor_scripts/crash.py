"""Bad input: a script that fails at its sixth step (after reading the loss in every step)."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
total = 0.0
for step, (x, y) in enumerate(tiny.loader()):
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.item()  # FAULT: host_read
    torch_xla.sync()
    if step == 5:
        raise ValueError("planted: the loss went NaN")  # CRASH
print("never here")
