"""Planted: a script started by xmp.spawn (torch_xla's older launcher), reading the loss in the step."""

import tiny
import torch
import torch_xla
import torch_xla.distributed.xla_multiprocessing as xmp


def _mp_fn(index):
    device = torch_xla.device()
    model, optimizer = tiny.model_and_optimizer(device)
    for x, y in tiny.loader():
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() > 10:  # FAULT: host_read
            print("diverged")
        torch_xla.sync()


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
