"""A zoo of what users bring: models, optimizers, rate changes and loaders, each case small enough for CI.

A :class:`Case` is one training job as a user writes it: a model, an
optimizer built on it, a loader, a loss function, and what the user does
between steps (a rate set by hand on their own optimizer, a plateau scheduler
stepped with a metric). Its ``features`` name what is unusual about it; a
practice's claim refuses cases by feature (:class:`xlapipe.claims.Refusal`).
Everything is seeded: building a case twice gives the same weights and data.

Add cases of your own to :data:`ZOO` (or pass your own list to the harness).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from attrs import field, frozen
from torch import nn
from torch.nn import functional as F

LossFn = Callable[[nn.Module, Any], torch.Tensor]
RateChange = Callable[[torch.optim.Optimizer, int], None]  # (the user's optimizer, step index)
EpochEnd = Callable[[Any, int], None]  # (the user's scheduler or optimizer, epoch index)

FEATURES = {
    "plain": "an MLP, SGD with momentum, a shuffled DataLoader",
    "adamw": "AdamW",
    "scheduler": "a scheduler built by the run (TrainingSetup(scheduler=...))",
    "plateau": "ReduceLROnPlateau on the user's optimizer, stepped with a metric each epoch",
    "lr_by_hand": "the rate set on the user's optimizer before each step (nanoGPT)",
    "lr_relative": "the rate halved on the user's optimizer each epoch (g['lr'] *= 0.5)",
    "tensor_lr": "a tensor learning rate, changed in place (g['lr'].fill_(...))",
    "batchnorm": "batch norm in training",
    "elu": "ELU, CELU and SELU activations (torch_xla 2.9's own elu gradient is wrong below 0)",
    "std_norm": "a normalisation written with Tensor.std (under dynamo torch_xla 2.9 gives std no gradient)",
    "reductions": "torch.diagonal over dims 0 and 1 of a 3-D tensor and reductions given an empty dimension "
    "list (torch_xla 2.9 computes both wrong; eager's own std and var give no usable gradient there)",
    "resize": "F.interpolate by scales that do not give whole sizes, bilinear and nearest (torch_xla 2.9 "
    "resizes by the sizes' ratio)",
    "batched_svd": "singular values of a batch of matrices as features (torch_xla 2.9's batched SVD is wrong)",
    "frozen_bn": "batch norm held in eval mode while the rest trains",
    "eval_model": "the whole model in eval mode while it trains (dropout off)",
    "dropout": "dropout in training (masks differ between devices: compared device to device)",
    "lstm_state": "an LSTM carrying its hidden state from batch to batch (in a buffer)",
    "unused_branch": "a branch some batches do not reach (a skipped expert)",
    "tied": "tied input and output embeddings",
    "frozen_params": "frozen parameters, left out of the optimizer",
    "rate0_group": "two parameter groups, one at rate 0",
    "dict_batch": "dict batches (Hugging Face style)",
    "list_loader": "a list of batches",
    "iterable": "a plain iterable of batches (no len, no position)",
    "iterable_dataset": "an IterableDataset drawing noise from torch's generator",
    "workers": "a DataLoader with 2 worker processes",
    "py_random_sampler": "a sampler shuffling with Python's random",
    "numpy_sampler": "a sampler shuffling with NumPy's global generator",
    "torch_aug": "__getitem__ augmentation drawing from torch's global generator",
    "text": "token batches of varying length, padded to their longest, as dicts with an attention mask",
    "hf_model": "a Hugging Face transformers model (a 2-layer BERT)",
    "layer_stack": "a stack of identical layers (nn.ModuleList named 'layers')",
}
SIZE, WIDTH, BATCH, VOCAB = 80, 8, 16, 30  # 5 batches an epoch


def _features(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@frozen
class Case:
    """One training job as a user writes it (see the module docstring)."""

    name: str
    features: frozenset[str] = field(converter=_features)
    model: Callable[[], nn.Module]
    loader: Callable[[], Any]
    loss_fn: LossFn
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None  # built by the run
    rate: RateChange | None = None  # before each step, on the user's optimizer
    epoch_end: EpochEnd | None = None  # after each epoch, on the user's scheduler (plateau)
    user_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None  # built on the user's optimizer
    epochs: int = 2

    def __attrs_post_init__(self) -> None:
        unknown = sorted(self.features - set(FEATURES))
        if unknown:
            raise ValueError(f"case {self.name}: unknown features {unknown}; known: {', '.join(FEATURES)}")

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A fresh model and optimizer, the same every time."""
        torch.manual_seed(0)
        model = self.model()
        optimizer = (_sgd if self.optimizer is None else self.optimizer)(model)
        return model, optimizer


# -- models ---------------------------------------------------------------------------------


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.ReLU(), nn.Linear(16, 2))


def elu_mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(WIDTH, 16),
        nn.ELU(),
        nn.Linear(16, 16),
        nn.CELU(0.5),
        nn.Linear(16, 16),
        nn.SELU(),
        nn.Linear(16, 2),
    )


class StdNorm(nn.Module):
    """A hand-written normalisation over the features, with ``Tensor.std``."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.out = nn.Linear(WIDTH, 16), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        return self.out(torch.tanh((h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-5)))


class Reductions(nn.Module):
    """Calls torch_xla 2.9 gets wrong without a word: a diagonal over dims 0 and 1 of a 3-D tensor, and
    sum, mean and vector_norm over an empty dimension list (every dimension, in PyTorch)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.out = nn.Linear(WIDTH, 16), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.up(x))
        blocks = h.view(-1, 4, 4).permute(1, 2, 0)  # (4, 4, batch)
        h = h * (1 + torch.diagonal(blocks, 1).sum(-1, keepdim=True))  # the diagonal over dims 0 and 1
        every = ()  # what tuple(range(1, h.dim() - 1)) gives generic code here
        h = (h - h.mean(every)) * (2 + torch.tanh(h.sum(every, keepdim=True)))
        return self.out(4 * h / torch.linalg.vector_norm(h, dim=every))


class Resize(nn.Module):
    """Features as a 4 x 4 image, resized by 1.7 (bilinear, to 6 x 6) and by 0.6 (nearest, to 3 x 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.out = nn.Linear(WIDTH, 16), nn.Linear(16 + 9, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.up(x))
        big = F.interpolate(h.view(-1, 1, 4, 4), scale_factor=1.7, mode="bilinear")
        return self.out(torch.cat([h, F.interpolate(big, scale_factor=0.6).flatten(1)], 1))


class Spectral(nn.Module):
    """Each sample's features as a 4 x 4 matrix, its singular values a feature of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.out = nn.Linear(WIDTH, 16), nn.Linear(16 + 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.up(x))
        return self.out(torch.cat([h, torch.linalg.svdvals(h.view(-1, 4, 4))], 1))


def bn_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class FrozenNorm(nn.Module):
    """Batch norm kept in eval mode however the model is switched (the frozen-BN fine-tune)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = bn_mlp()
        norm = self.inner[1]
        assert (
            isinstance(norm, nn.BatchNorm1d)
            and norm.running_mean is not None
            and norm.running_var is not None
        )
        with torch.no_grad():
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)

    def train(self, mode: bool = True) -> FrozenNorm:
        super().train(mode)
        self.inner[1].eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class EvalModel(FrozenNorm):
    """A model trained in eval mode (``model.eval()`` to switch dropout off): batch norm frozen too."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def train(self, mode: bool = True) -> EvalModel:
        return super().train(False)  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.drop(x))


def dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 2))


class Recurrent(nn.Module):
    """An LSTM whose hidden state carries from one batch to the next, kept in buffers (checkpointed)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(WIDTH, 12, batch_first=True)
        self.head = nn.Linear(12, 2)
        self.h: torch.Tensor
        self.c: torch.Tensor
        self.register_buffer("h", torch.zeros(1, BATCH, 12))
        self.register_buffer("c", torch.zeros(1, BATCH, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(x.view(x.shape[0], 2, WIDTH // 2).repeat(1, 1, 2), (self.h, self.c))
        self.h, self.c = h.detach(), c.detach()  # buffers replaced, not written in place
        return self.head(out[:, -1])


class Experts(nn.Module):
    """Two experts; the second is reached only by batches that ask for it (``batch["expert"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(WIDTH, 16)
        self.experts = nn.ModuleList([nn.Linear(16, 2), nn.Linear(16, 2)])

    def forward(self, x: torch.Tensor, expert: int = 0) -> torch.Tensor:
        return self.experts[expert](torch.relu(self.body(x)))


class Tied(nn.Module):
    """Input and output embeddings sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens).mean(1))))


class Stack(nn.Module):
    """Three identical blocks in ``self.layers``, called in a loop."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.Tanh()) for _ in range(3)
        )
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class BagOfTokens(nn.Module):
    """A mean of token embeddings under the attention mask, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 12)
        self.head = nn.Linear(12, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        return self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1))


def bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def frozen_mlp() -> nn.Sequential:
    model = mlp()
    model[0].requires_grad_(False)
    return model


# -- optimizers and rate changes ---------------------------------------------------------------


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def _trainable_sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)


def _two_groups(model: nn.Module) -> torch.optim.Optimizer:
    assert isinstance(model, nn.Sequential)
    first = list(model[0].parameters())
    rest = [p for m in list(model)[1:] for p in m.parameters()]
    groups: list[dict[str, Any]] = [{"params": first, "lr": 0.0}, {"params": rest}]
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def _tensor_rate(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1), momentum=0.9)


def _by_hand(optimizer: torch.optim.Optimizer, step: int) -> None:
    for g in optimizer.param_groups:
        g["lr"] = 0.1 * (1 + step % 4) / 4


def _fill(optimizer: torch.optim.Optimizer, step: int) -> None:
    for g in optimizer.param_groups:
        g["lr"].fill_(0.1 / (1 + step))


def _halve(optimizer: Any, epoch: int) -> None:
    for g in optimizer.param_groups:
        g["lr"] *= 0.5


def _plateau_step(scheduler: Any, epoch: int) -> None:
    scheduler.step(1.0)  # a metric that never improves: the rate drops after `patience` epochs


def _warmup(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 4))


def _plateau(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)


# -- data ---------------------------------------------------------------------------------


def _data(n: int = SIZE, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, WIDTH, generator=g)
    return x, (x.sum(1) > 0).long()


def _dataset() -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(*_data())


def shuffled(**kwargs: Any) -> Callable[[], torch.utils.data.DataLoader]:
    def make() -> torch.utils.data.DataLoader:
        g = torch.Generator().manual_seed(7)
        return torch.utils.data.DataLoader(_dataset(), batch_size=BATCH, shuffle=True, generator=g, **kwargs)

    return make


def _list_loader() -> list:
    x, y = _data()
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, SIZE, BATCH)]


class Batches:
    """A plain iterable of batches: no length, no position."""

    def __iter__(self) -> Iterator[Any]:
        return iter(_list_loader())


class Noisy(torch.utils.data.IterableDataset):
    """An IterableDataset that adds noise drawn from torch's global generator."""

    def __iter__(self) -> Iterator[Any]:
        x, y = _data()
        for i in range(SIZE):
            yield x[i] + 0.1 * torch.randn(WIDTH), y[i]


class Augmented(torch.utils.data.Dataset):
    """A dataset whose ``__getitem__`` adds noise from torch's global generator."""

    def __init__(self) -> None:
        self.x, self.y = _data()

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(WIDTH), self.y[i]


class PythonShuffle(torch.utils.data.Sampler):
    """A sampler shuffling with Python's ``random``."""

    def __init__(self) -> None:
        self.n = SIZE

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)


class NumpyShuffle(PythonShuffle):
    """A sampler shuffling with NumPy's global generator."""

    def __iter__(self) -> Iterator[int]:
        return iter(int(i) for i in np.random.permutation(self.n))


def _loader(dataset: Callable[[], Any], **kwargs: Any) -> Callable[[], torch.utils.data.DataLoader]:
    return lambda: torch.utils.data.DataLoader(dataset(), batch_size=BATCH, **kwargs)


def _tokens() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 10, (SIZE, 4), generator=g)
    data = torch.utils.data.TensorDataset(tokens, tokens[:, 0])
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=g)


class Sentences(torch.utils.data.Dataset):
    """Token sequences of 6 or 10 tokens, labelled by whether their first token is even."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(5)
        lengths = 6 + 4 * torch.randint(0, 2, (SIZE,), generator=g)  # two lengths: few graphs
        self.items = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.items[i]


def pad_to_longest(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The usual text collate: padded to the batch's longest item, with an attention mask."""
    longest = max(len(t) for t in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros(len(items), longest, dtype=torch.long)
    for row, t in enumerate(items):
        ids[row, : len(t)], mask[row, : len(t)] = t, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids[:, 0] % 2}


def _sentences() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(9)
    return torch.utils.data.DataLoader(
        Sentences(), batch_size=BATCH, shuffle=True, generator=g, collate_fn=pad_to_longest
    )


def _dicts() -> list[dict[str, Any]]:
    return [{"input": x, "labels": y} for x, y in _list_loader()]


def _routed() -> list[dict[str, Any]]:
    return [{"input": x, "labels": y, "expert": i % 2} for i, (x, y) in enumerate(_list_loader())]


# -- loss functions --------------------------------------------------------------------------


def xy_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def dict_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return F.cross_entropy(model(batch["input"]), batch["labels"])


def text_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return F.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])


def hf_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return model(**batch).loss


def routed_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return F.cross_entropy(model(batch["input"], batch["expert"]), batch["labels"])


# -- the zoo -----------------------------------------------------------------------------------

ZOO: list[Case] = [
    Case("plain", {"plain"}, mlp, shuffled(), xy_loss),
    Case("adamw_scheduled", {"adamw", "scheduler"}, mlp, shuffled(), xy_loss, _adamw, scheduler=_warmup),
    Case("plateau", {"plateau"}, mlp, shuffled(), xy_loss, user_scheduler=_plateau, epoch_end=_plateau_step),
    Case("lr_by_hand", {"lr_by_hand", "adamw"}, mlp, shuffled(), xy_loss, _adamw, rate=_by_hand),
    Case("lr_relative", {"lr_relative"}, mlp, shuffled(), xy_loss, epoch_end=_halve),
    Case("tensor_lr", {"tensor_lr"}, mlp, shuffled(), xy_loss, _tensor_rate, rate=_fill),
    Case("batchnorm", {"batchnorm"}, bn_mlp, shuffled(), xy_loss),
    Case("elu", {"elu"}, elu_mlp, shuffled(), xy_loss),
    Case("std_norm", {"std_norm"}, StdNorm, shuffled(), xy_loss),
    Case("reductions", {"reductions"}, Reductions, shuffled(), xy_loss),
    Case("resize", {"resize"}, Resize, shuffled(), xy_loss),
    Case("batched_svd", {"batched_svd"}, Spectral, shuffled(), xy_loss),
    Case("frozen_bn", {"frozen_bn"}, FrozenNorm, shuffled(), xy_loss, _adamw),
    Case("eval_model", {"eval_model", "frozen_bn"}, EvalModel, shuffled(), xy_loss),
    Case("dropout", {"dropout"}, dropout_mlp, shuffled(), xy_loss),
    Case("lstm_state", {"lstm_state"}, Recurrent, shuffled(drop_last=True), xy_loss),
    Case("unused_branch", {"unused_branch", "dict_batch", "list_loader"}, Experts, _routed, routed_loss),
    Case("tied", {"tied", "adamw"}, Tied, _tokens, xy_loss, _adamw),
    Case("frozen_params", {"frozen_params"}, frozen_mlp, shuffled(), xy_loss, _trainable_sgd),
    Case("rate0_group", {"rate0_group"}, mlp, shuffled(), xy_loss, _two_groups),
    Case("dict_batch", {"dict_batch", "list_loader"}, mlp, _dicts, dict_loss),
    Case("list_loader", {"list_loader"}, mlp, _list_loader, xy_loss),
    Case("iterable", {"iterable"}, mlp, Batches, xy_loss),
    Case("iterable_dataset", {"iterable_dataset"}, mlp, _loader(Noisy), xy_loss),
    Case("workers", {"workers", "torch_aug"}, mlp, _loader(Augmented, shuffle=True, num_workers=2), xy_loss),
    Case(
        "py_random_sampler", {"py_random_sampler"}, mlp, _loader(_dataset, sampler=PythonShuffle()), xy_loss
    ),
    Case("numpy_sampler", {"numpy_sampler"}, mlp, _loader(_dataset, sampler=NumpyShuffle()), xy_loss),
    Case("torch_aug", {"torch_aug"}, mlp, _loader(Augmented, shuffle=True), xy_loss),
    Case("text", {"text", "dict_batch"}, BagOfTokens, _sentences, text_loss, _adamw),
    Case("hf_bert", {"hf_model", "text", "dict_batch"}, bert, _sentences, hf_loss, _adamw),
    Case("layer_stack", {"layer_stack"}, Stack, shuffled(), xy_loss),
]


def case(name: str) -> Case:
    """The zoo's case ``name``."""
    for c in ZOO:
        if c.name == name:
            return c
    raise KeyError(f"no case {name!r} in the zoo; cases: {', '.join(c.name for c in ZOO)}")
