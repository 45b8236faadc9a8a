"""No fault: mask_index.py with the doctor's fix: a masked mean over every row keeps the shapes."""

import tiny
import torch
import torch_xla

device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
loader = tiny.loader(n=176, batch_size=16)
loader = torch.utils.data.DataLoader(loader.dataset, batch_size=16, drop_last=True)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    logits = model(x)
    keep = (x[:, 0] > 0).float()
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    loss = (losses * keep).sum() / keep.sum().clamp(min=1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
