"""Planted: a script started by torch_xla.launch (a fresh interpreter per replica), reading the loss in the step."""

import tiny
import torch
import torch_xla


def _mp_fn(index):
    device = torch_xla.device()
    model, optimizer = tiny.model_and_optimizer(device)
    total = 0.0
    for x, y in tiny.loader():
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total += loss.item()  # FAULT: host_read
        torch_xla.sync()
    print(f"replica {index}: mean loss {total / 10:.4f}")


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=())
