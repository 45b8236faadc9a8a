"""No fault: the training step as a function wrapped by torch_xla.compile (its own step marker)."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)


@torch_xla.compile
def train_step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


for x, y in tiny.loader():
    loss = train_step(x.to(device), y.to(device))
print(f"final loss {loss.item():.4f}")
