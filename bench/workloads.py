"""The work every peer does: models, data, loss, optimizer, built from a seed.

Every peer of a workload calls the same builders with the same seed, so the
model's initial weights, the batches (contents, order, padding) and the
optimizer's hyper-parameters are identical; only the training loop differs.

The text workloads reuse the NLP example's builders (``examples/nlp_example.py``:
its BERT sizes, its synthetic MRPC-shaped pairs of 20 to 110 tokens, its
pad-to-longest collate and its loss); the host-bound model is bench-local.
Unlike the example, no learning-rate schedule is used (a changing float
learning rate would recompile a compiled optimizer update) and the loaders are
not shuffled, so every peer sees the same batches in the same order.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from attrs import frozen
from torch import nn

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@frozen
class Workload:
    """What a peer needs to train: everything built from ``seed``."""

    name: str
    kind: str  # "text" or "dense"
    batch_size: int
    build_model: Callable[[int], nn.Module]
    build_data: Callable[[int, int], Any]  # (n items, seed) -> a dataset
    collate: Callable[[list], Any]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    lr: float
    length: int | None = None  # the fixed length xlapipe's static_shapes pads to (text)


# -- text: the NLP example's BERT on MRPC-shaped pairs ----------------------------------


def nlp_example() -> Any:
    """``examples/nlp_example.py`` as a module (its builders are reused here)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module("nlp_example")


def bert(size: str = "small") -> Callable[[int], nn.Module]:
    """The example's ``BertForSequenceClassification`` at ``size`` (base, small, tiny)."""

    def build(seed: int) -> nn.Module:
        from transformers import BertConfig, BertForSequenceClassification
        from transformers.utils import logging

        logging.set_verbosity_error()
        torch.manual_seed(seed)
        return BertForSequenceClassification(BertConfig(num_labels=2, **nlp_example().MODELS[size]))

    return build


def pairs(n: int, seed: int) -> torch.utils.data.Dataset:
    """The example's synthetic sentence pairs (20 to 110 tokens), as a tokenizer gives them."""
    ex = nlp_example()
    return ex.Pairs(ex.make_pairs(n, seed))


class PadText:
    """The example's pad-to-longest collate (``length=None``), or padded on to ``length``."""

    def __init__(self, length: int | None = None):
        self.length = length

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = nlp_example().pad_to_longest(items)
        if self.length is None:
            return batch
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            t = batch[key]
            out = t.new_zeros(t.shape[0], self.length)
            out[:, : t.shape[1]] = t
            batch[key] = out
        return batch

    def __repr__(self) -> str:
        return f"PadText(length={self.length})"


def text_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


# -- dense: the host-bound model ------------------------------------------------------


def mlp(width: int = 64, depth: int = 8) -> Callable[[int], nn.Module]:
    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < depth - 1 else [])
        return nn.Sequential(*layers)

    return build


def dense_data(width: int = 64) -> Callable[[int, int], list]:
    def build(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, width, generator=g)
        y = torch.randint(0, width, (n,), generator=g)
        return list(zip(x, y))

    return build


def dense_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def stack(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*items)
    return torch.stack(xs), torch.stack(ys)


# -- the workloads ----------------------------------------------------------------------


def get(name: str, smoke: bool = False) -> Workload:
    """The workload ``name`` (``smoke``: the same loops on a toy-sized model)."""
    size = "tiny" if smoke else "small"
    lr = nlp_example().PRESETS[size]["lr"] if name in ("bert", "varlen") else 1e-3
    if name == "bert":  # every batch padded to 128
        return Workload("bert", "text", 16, bert(size), pairs, PadText(128), text_loss, lr, length=128)
    if name == "varlen":  # padded to the longest pair of each batch, unless a peer fixes it
        return Workload("varlen", "text", 16, bert(size), pairs, PadText(None), text_loss, lr, length=128)
    if name == "hostbound":
        return Workload("hostbound", "dense", 16, mlp(), dense_data(), stack, dense_loss, 1e-3)
    raise ValueError(f"unknown workload {name!r}; choose bert, varlen or hostbound")


def loader(work: Workload, n_batches: int, seed: int) -> torch.utils.data.DataLoader:
    """The one loader every peer starts from: fixed order, ``n_batches`` full batches."""
    items = work.build_data(n_batches * work.batch_size, seed + 1)
    return torch.utils.data.DataLoader(
        items, batch_size=work.batch_size, shuffle=False, collate_fn=work.collate, drop_last=True
    )


def optimizer(work: Workload, params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=work.lr)
