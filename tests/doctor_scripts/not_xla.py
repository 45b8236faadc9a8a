"""Bad input: eager PyTorch on the CPU; torch_xla never imported."""

import tiny
import torch

model, optimizer = tiny.model_and_optimizer()
for x, y in tiny.loader(n=48):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"final loss {loss.item():.4f}")
