"""Planted: a dataset slow to give its items, read in the training loop's thread."""

import time

import tiny
import torch
import torch_xla


class Slow(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(0.003)  # decoding, augmenting...
        return self.data[i]


device = torch_xla.device()
model, optimizer = tiny.model_and_optimizer(device)
base = tiny.loader().dataset
for x, y in tiny.loader(dataset=Slow(base)):  # FAULT: input_bound
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print("done")
