"""static_shapes: pad text batches to a fixed length, or to one of a few buckets.

XLA compiles one graph per input shape. Text batches padded to their longest
item take a new length almost every step, and each new length costs a
compilation (measured: 40 batches of 20 to 110 tokens, BERT 4 layers, took
122.6 s with 29 compilations padded to the longest, 40.2 s with 3 padded to
128). This transform rebuilds each ``torch.utils.data.DataLoader`` of the setup
with its ``collate_fn`` wrapped: the batch the user's collate returns (a dict
of ``[batch, length, ...]`` tensors, padded to its longest item) is padded
further along dimension 1 to ``length``, or to the smallest of ``buckets`` that
holds it. The user's loaders are left as they were.

Token labels are padded too: a ``labels`` tensor of shape ``[batch, length]``
whose length is the inputs' (a causal language model's labels, or a token
classifier's) is padded with ``label_pad_value``, -100 by default: the index
transformers' losses and ``torch.nn.functional.cross_entropy`` ignore, so the
padded positions add nothing to the loss. Labels of another shape (one per
sequence, or a decoder's of another length) are left alone.

The last batch of an epoch is usually smaller (a new batch dimension, so one
more graph); ``drop_last=("train",)`` drops it from the named loaders.
It must come before ``wrap_loader_mp``, which wraps the rebuilt loaders.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

import torch
from attrs import frozen
from torch.utils.data import DataLoader, IterableDataset

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.loader_position import copy_loader
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, practice, register

PAD_VALUES = (("attention_mask", 0), ("input_ids", 0), ("token_type_ids", 0))
LABELS = "labels"
IGNORE_INDEX = -100  # what transformers' losses and cross_entropy skip


class PadCollate:
    """``collate_fn`` that pads the inner collate's batch to a fixed or bucket length."""

    def __init__(
        self,
        inner: Callable[[list], Any],
        sizes: tuple[int, ...],
        pad_values: tuple[tuple[str, int], ...],
        label_pad_value: int | None = IGNORE_INDEX,
    ):
        self.inner = inner
        self.sizes = sizes  # one fixed length, or the buckets, ascending
        self.pad_values = dict(pad_values)
        self.label_pad_value = label_pad_value  # for token labels as long as the inputs (None: untouched)

    def target(self, length: int) -> int:
        """The padded length for a batch whose longest item is ``length``."""
        for size in self.sizes:
            if length <= size:
                return size
        what = f"length={self.sizes[0]}" if len(self.sizes) == 1 else f"the largest bucket ({self.sizes[-1]})"
        raise ValueError(
            f"static_shapes: a batch is {length} long, more than {what}. Truncate items "
            f"when tokenising (e.g. truncation=True, max_length={self.sizes[-1]}) or raise "
            "static_shapes' length / add a larger bucket."
        )

    def __call__(self, items: list) -> Any:
        batch = self.inner(items)
        if not isinstance(batch, Mapping):
            raise TypeError(
                "static_shapes pads dict batches ({'input_ids': ..., 'attention_mask': ...}); "
                f"the loader's collate_fn returned a {type(batch).__name__}. Return a dict "
                "from collate_fn, or pad the batches yourself."
            )
        keys = [k for k in self.pad_values if k in batch]
        if not keys:
            raise KeyError(
                f"static_shapes: none of the keys it pads ({', '.join(self.pad_values)}) is in "
                f"the batch (keys: {', '.join(map(str, batch))}); name yours with "
                "pad_values=(('key', pad_value), ...)"
            )
        for k in keys:
            value = batch[k]
            if not isinstance(value, torch.Tensor) or value.dim() < 2:
                shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"static_shapes pads dimension 1 of [batch, length, ...] tensors; batch "
                    f"key {k!r} is {shape}. Remove {k!r} from pad_values."
                )
        length = max(batch[k].shape[1] for k in keys)
        size = self.target(length)
        padded = {k: _pad(batch[k], size, self.pad_values[k]) for k in keys}
        if self.label_pad_value is not None and LABELS not in self.pad_values:
            labels = batch.get(LABELS)
            if _token_labels(labels, batch[keys[0]].shape[0], length):
                padded[LABELS] = _pad(labels, size, self.label_pad_value)
        try:  # keep the batch's own mapping type (e.g. transformers' BatchEncoding)
            out: Any = copy.copy(batch)  # a mutable mapping, or the error below
            out.update(padded)
            return out
        except (TypeError, AttributeError):
            return {**batch, **padded}

    def __repr__(self) -> str:
        return (
            f"PadCollate(sizes={self.sizes}, pad_values={self.pad_values}, "
            f"label_pad_value={self.label_pad_value}, inner={self.inner!r})"
        )


def _token_labels(labels: object, batch_size: int, length: int) -> TypeGuard[torch.Tensor]:
    """Whether ``labels`` holds one integer label per input token: ``[batch, length]``."""
    return (
        isinstance(labels, torch.Tensor)
        and tuple(labels.shape) == (batch_size, length)
        and not labels.is_floating_point()
        and not labels.is_complex()
        and labels.dtype != torch.bool
    )


def _pad(t: torch.Tensor, size: int, value: int) -> torch.Tensor:
    if t.shape[1] == size:
        return t
    out = t.new_full((t.shape[0], size, *t.shape[2:]), value)
    out[:, : t.shape[1]] = t
    return out


def rebuild_loader(
    loader: Any,
    name: str,
    sizes: tuple[int, ...],
    pad_values: tuple[tuple[str, int], ...],
    drop_last: bool = False,
    label_pad_value: int | None = IGNORE_INDEX,
) -> DataLoader:
    """A new DataLoader like ``loader``, its collate_fn wrapped in :class:`PadCollate`."""
    if not isinstance(loader, DataLoader):
        hint = (
            " static_shapes must come before wrap_loader_mp, which wraps the loaders it gets."
            if "DeviceLoader" in type(loader).__name__
            else ""
        )
        raise TypeError(
            f"static_shapes rebuilds torch.utils.data.DataLoader objects to pad in their "
            f"collate step; loader {name!r} is a {type(loader).__name__}.{hint} Build it as a "
            "DataLoader, or pad its batches yourself."
        )
    inner = loader.collate_fn
    if isinstance(inner, PadCollate):  # re-padding: replace, never nest
        inner = inner.inner
    collate = PadCollate(inner, sizes, pad_values, label_pad_value)
    mapped = not isinstance(loader.dataset, IterableDataset)
    if mapped and loader.batch_size is None and loader.batch_sampler is None:
        raise ValueError(
            f"static_shapes: loader {name!r} hands out single items (batch_size=None), so "
            "there is no batch to pad; give it a batch_size"
        )
    if mapped and drop_last and loader.batch_size is None:
        raise ValueError(
            f"static_shapes: loader {name!r} uses its own batch_sampler, so static_shapes "
            "cannot drop its last batch; drop it in the batch sampler, or leave "
            f"{name!r} out of drop_last"
        )
    rebuilt: DataLoader = copy_loader(loader, collate_fn=collate, drop_last=loader.drop_last or drop_last)
    return rebuilt


def _apply(
    setup: TrainingSetup,
    length: int | None,
    buckets: tuple[int, ...] | None,
    pad_values: tuple[tuple[str, int], ...],
    loaders: tuple[str, ...] | None,
    drop_last: tuple[str, ...],
    label_pad_value: int | None = IGNORE_INDEX,
) -> TrainingSetup:
    sizes = (length,) if length is not None else tuple(buckets or ())
    if not setup.loaders:
        raise ValueError(
            "static_shapes pads the batches of the setup's loaders, and this setup has none: it would do "
            "nothing. Give the loader in TrainingSetup(model, optimizer, loaders={'train': loader}), or "
            "pad the batches you feed to run.step yourself and drop static_shapes"
        )
    names = set(setup.loaders) if loaders is None else set(loaders)
    unknown = (names | set(drop_last)) - set(setup.loaders)
    if unknown:
        raise KeyError(
            f"static_shapes: no loader named {', '.join(sorted(map(repr, unknown)))} in the "
            f"setup (loaders: {', '.join(map(repr, setup.loaders)) or 'none'})"
        )
    return setup.evolve(
        loaders={
            name: (
                rebuild_loader(loader, name, sizes, pad_values, name in drop_last, label_pad_value)
                if name in names
                else loader
            )
            for name, loader in setup.loaders.items()
        }
    )


def _positive_ints(value: Any, what: str) -> tuple[int, ...]:
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"static_shapes: {what} must be positive ints, got {value!r}")
    return values


def _names(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    values = (value,) if isinstance(value, str) else tuple(value)
    if any(not isinstance(v, str) for v in values):
        raise ValueError(f"static_shapes: {what} must be loader names (strings), got {value!r}")
    return tuple(sorted(set(values)))


def _pad_values(value: Mapping[str, int] | Iterable[Sequence]) -> tuple[tuple[str, int], ...]:
    pairs = list(value.items()) if isinstance(value, Mapping) else [tuple(p) for p in value]
    for pair in pairs:
        if (
            len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], (int, float))
            or isinstance(pair[1], bool)
        ):
            raise ValueError(
                "static_shapes: pad_values must be (key, value) pairs such as "
                f"(('input_ids', 0), ('attention_mask', 0)); got {pair!r}"
            )
    if not pairs or len({k for k, _ in pairs}) != len(pairs):
        raise ValueError(f"static_shapes: pad_values must name each key once, got {value!r}")
    return tuple(sorted((k, v) for k, v in pairs))


@frozen
class StaticShapes:
    """The practice's parameters, checked and put in order by :func:`static_shapes`."""

    length: int | None
    buckets: tuple[int, ...] | None
    pad_values: tuple[tuple[str, int], ...]
    loaders: tuple[str, ...] | None
    drop_last: tuple[str, ...]
    label_pad_value: int | None


@register
def static_shapes(
    length: int | None = None,
    buckets: Sequence[int] | None = None,
    pad_values: Mapping[str, int] | Iterable[Sequence] = PAD_VALUES,
    loaders: Sequence[str] | str | None = None,
    drop_last: Sequence[str] | str = (),
    label_pad_value: int | None = IGNORE_INDEX,
) -> Transform:
    """Pad text batches to ``length``, or to the smallest of ``buckets`` that fits.

    ``pad_values``: the keys to pad and their pad value (``input_ids``,
    ``attention_mask``, ``token_type_ids`` with 0 by default). ``labels`` of
    shape ``[batch, length]``, as long as those inputs (token labels), are
    padded with ``label_pad_value`` (-100, ignored by transformers' losses;
    None leaves them alone); other labels are untouched, and naming
    ``labels`` in ``pad_values`` pads it always, with that value.
    ``loaders``: the loaders to rebuild (all by default). ``drop_last``:
    loaders whose last, smaller batch is dropped.
    """
    if (length is None) == (buckets is None):
        raise ValueError(
            "static_shapes needs exactly one of length (e.g. static_shapes(length=128)) "
            "or buckets (e.g. static_shapes(buckets=(32, 64, 128)))"
        )
    if length is not None:
        sizes = _positive_ints(length, "length")
        if len(sizes) != 1:
            raise ValueError(
                f"static_shapes: length is one positive int, got {length!r}; use buckets for several"
            )
    else:
        sizes = _positive_ints(buckets, "buckets")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"static_shapes: buckets must be distinct, got {buckets!r}")
        sizes = tuple(sorted(sizes))
    pads = _pad_values(pad_values)
    if label_pad_value is not None and (
        not isinstance(label_pad_value, int) or isinstance(label_pad_value, bool)
    ):
        raise ValueError(
            f"static_shapes: label_pad_value must be an int (-100, the index transformers' losses "
            f"ignore) or None (leave labels alone), got {label_pad_value!r}"
        )
    names = _names(loaders, "loaders")
    dropped = _names(drop_last, "drop_last") or ()
    if names is not None and not set(dropped) <= set(names):
        raise ValueError(
            f"static_shapes: drop_last names loaders not in loaders: {sorted(set(dropped) - set(names))}"
        )
    spec = StaticShapes(
        length=sizes[0] if length is not None else None,
        buckets=sizes if buckets is not None else None,
        pad_values=pads,
        loaders=names,
        drop_last=dropped,
        label_pad_value=label_pad_value,
    )
    return practice("static_shapes", spec, _apply)


claims.declare(
    Claim(
        "static_shapes",
        lambda: static_shapes(length=16),
        summary="batches padded to fixed shapes, so XLA compiles once",
        applies_to={"text"},
    )
)
