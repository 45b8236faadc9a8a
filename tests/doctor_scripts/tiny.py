"""What the planted-fault scripts share: a tiny model, its optimizer and loaders (all on the CPU).

Each script imports this from its own folder, as ``python script.py`` allows.
A line that holds a planted fault says so in a comment: ``# FAULT: kind``.
"""

import torch
from torch import nn


def model_and_optimizer(device=None, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if device is not None:
        model = model.to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def loader(n=160, batch_size=16, seed=1, dataset=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x.sum(1) > 0).long()
    data = dataset if dataset is not None else torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(data, batch_size=batch_size)


class Sequences(torch.utils.data.Dataset):
    """Token sequences whose length grows with the batch: batch i holds sequences of 6 + 3 * i tokens."""

    def __init__(self, n=160, batch_size=16):
        self.n, self.batch_size = n, batch_size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = 6 + 3 * (i // self.batch_size) - (i % 3)
        return torch.randint(1, 50, (length,), generator=g), torch.tensor(i % 2)


def pad_to_longest(items):
    length = max(len(ids) for ids, _ in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    for row, (seq, _) in enumerate(items):
        ids[row, : len(seq)] = seq
    return ids, torch.stack([label for _, label in items])


class Bag(nn.Module):
    """Mean of the token embeddings, then a linear classifier."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(50, 8), nn.Linear(8, 2)

    def forward(self, ids):
        return self.out(self.embed(ids).mean(1))


def sequence_model_and_loader(device=None):
    torch.manual_seed(0)
    model = Bag()
    if device is not None:
        model = model.to(device)
    data = torch.utils.data.DataLoader(Sequences(), batch_size=16, collate_fn=pad_to_longest)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), data
