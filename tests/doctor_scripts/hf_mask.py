"""Planted (in library code): transformers reads the attention mask on the host in every forward.

The read is in transformers' mask code, not in this script: the fix is the
practice made for it (hf_traced_masks), not a change to the line that calls the model.
"""

import torch
import torch_xla
from transformers import BertConfig, BertForSequenceClassification

device = torch_xla.device()
torch.manual_seed(0)
config = BertConfig(
    vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
)
model = BertForSequenceClassification(config).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
mask = torch.ones(16, dtype=torch.long)
mask[12:] = 0  # the last four tokens are padding
data = [
    {
        "input_ids": torch.randint(1, 50, (16,), generator=g),
        "attention_mask": mask,
        "labels": torch.tensor(i % 2),
    }
    for i in range(80)
]
for batch in torch.utils.data.DataLoader(data, batch_size=8):
    batch = {k: v.to(device) for k, v in batch.items()}
    loss = model(**batch).loss  # FAULT: host_read
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
print(f"final loss {loss.item():.4f}")
