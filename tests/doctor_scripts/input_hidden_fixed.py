"""Control for input_hidden.py: the same slow dataset read by 4 DataLoader workers, faster than the step."""

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
        time.sleep(0.005)  # decoding, augmenting...: 80 ms a batch of 16, 4 at once
        return self.data[i]


device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
base = tiny.loader(n=3200).dataset
faster = torch.utils.data.DataLoader(Slow(base), batch_size=16, num_workers=4, persistent_workers=True)
for x, y in pl.MpDeviceLoader(faster, device):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.03)  # the rest of a real step: 30 ms
print("done")
