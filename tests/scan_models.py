"""Models with stacks of repeated layers, for scan_layers' tests and bad inputs (nothing downloaded)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, LENGTH, BATCH = 100, 16, 4


def tiny_bert(layers: int = 3, dropout: float = 0.0, seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    return BertForSequenceClassification(
        BertConfig(
            num_hidden_layers=layers,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=VOCAB,
            max_position_embeddings=LENGTH,
            num_labels=2,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
    )


def tiny_gpt2(layers: int = 3, seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=layers,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=LENGTH,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )


def text_batches(n: int = 4, seed: int = 1, padded: bool = True) -> list[dict[str, torch.Tensor]]:
    """Token batches; the last quarter of each row is padding when ``padded``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g)
        mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
        if padded:
            mask[:, LENGTH * 3 // 4 :] = 0
        out.append(
            {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 2, (BATCH,), generator=g)}
        )
    return out


def bert_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def gpt2_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    ids = batch["input_ids"]
    return model(input_ids=ids, attention_mask=batch["attention_mask"], labels=ids, use_cache=False).loss


class Block(nn.Module):
    """A pre-norm residual MLP block that takes a gate (an extra tensor input)."""

    def __init__(self, width: int = 16, dropout: float = 0.0, act: Callable = torch.relu):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout)
        self.act = act

    def forward(self, x: torch.Tensor, gate: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + self.drop(self.fc2(self.act(self.fc1(self.norm(x))))) * gate * scale


class Stack(nn.Module):
    """A user's model: input layer, an nn.ModuleList of blocks looped over in forward, a head."""

    def __init__(self, depth: int = 4, width: int = 16, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList([Block(width, dropout) for _ in range(depth)])
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        gate = (x[:, :1] > -1.0).to(h.dtype)  # a tensor every block gets, computed on the device
        for block in self.blocks:
            h = block(h, gate, scale=0.5)
        return self.head(h)


class Mlp(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def sequential(depth: int = 4, width: int = 16, seed: int = 0) -> nn.Module:
    """An nn.Sequential whose middle is an nn.Sequential of identical blocks."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, width), nn.Sequential(*[Mlp(width) for _ in range(depth)]), nn.Linear(width, 2)
    )


def dense_batches(n: int = 4, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH * 2, 8, generator=g), torch.randint(0, 2, (BATCH * 2,), generator=g))
        for _ in range(n)
    ]


def dense_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


class Looped(Stack):
    """A Stack whose forward is given as ``loop(self, h, gate)``: the ways a loop can go wrong."""

    def __init__(self, loop: Callable, **kwargs):
        super().__init__(**kwargs)
        self.loop = loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        gate = (x[:, :1] > -1.0).to(h.dtype)
        return self.head(self.loop(self, h, gate))
