"""Bad input: a script that stops making progress after four steps (a stuck data pipeline)."""

import time

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
for step, (x, y) in enumerate(tiny.loader()):
    if step == 4:
        time.sleep(3600)  # HANG
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
