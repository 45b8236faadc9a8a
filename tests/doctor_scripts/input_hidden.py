"""Planted: a dataset slower than the step, hidden by MpDeviceLoader's queues in a short run.

The queues (24 batches) fill while the first graphs compile; then the host
loader makes about one batch for every two steps (80 ms against 40), and the queues drain: the
wait for a batch shows only once they are empty, after the steps diagnosed.
"""

import time

import tiny
import torch
import torch_xla
import torch_xla.distributed.parallel_loader as pl


class Slow(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(0.005)  # decoding, augmenting...: 80 ms a batch of 16
        return self.data[i]


device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
base = tiny.loader(n=3200).dataset
for x, y in pl.MpDeviceLoader(tiny.loader(dataset=Slow(base)), device):  # FAULT: input_bound
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.03)  # the rest of a real step: 30 ms
print("done")
