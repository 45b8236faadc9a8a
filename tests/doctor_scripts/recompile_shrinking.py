"""Planted: batches padded to their longest, which shrink: the longest batch comes first, in the warm-up."""

import tiny
import torch
import torch_xla


class Shrinking(tiny.Sequences):
    """Batch i holds sequences of 40 - 3 * i tokens."""

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = 40 - 3 * (i // self.batch_size) - (i % 3)
        return torch.randint(1, 50, (length,), generator=g), torch.tensor(i % 2)


device = torch_xla.device()
torch.manual_seed(0)
model = tiny.Bag().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(Shrinking(), batch_size=16, collate_fn=tiny.pad_to_longest)
for ids, y in loader:
    ids, y = ids.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(ids), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()  # FAULT: recompile
print("done")
