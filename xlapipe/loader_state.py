"""The random state of a run's data loaders: their generators, their samplers' epochs and seeds.

A ``DataLoader`` given its own ``generator`` (``shuffle=True, generator=g``,
or a ``RandomSampler(data, generator=g)``) draws each epoch's order, and its
workers' base seed, from that generator and not from torch's global one; a
``DistributedSampler`` shuffles by its ``seed + epoch``. Checkpoints save and
restore them, per loader name, through the device loaders that wrap them
(``wrap_loader_mp``) and the loaders ``static_shapes`` rebuilt (they keep the
same generator and sampler objects).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch_xla.distributed.parallel_loader import MpDeviceLoader

LoaderState = dict[str, dict[str, Any]]  # loader name -> {"sampler.generator": ByteTensor, ...}


def inner_loader(loader: Any) -> Any:
    """The loader a device loader feeds from (``loader`` itself when it is not one)."""
    seen: set[int] = set()
    while isinstance(loader, MpDeviceLoader) and id(loader) not in seen:
        seen.add(id(loader))
        loader = loader._loader
    return loader


def _parts(loader: Any) -> list[tuple[str, Any]]:
    """(path, object) for the loader and the samplers it draws from, each object once."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        ("loader", loader),
        ("sampler", getattr(loader, "sampler", None)),
        ("batch_sampler", batch_sampler),
        ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
    )
    seen: set[int] = set()
    parts = []
    for path, obj in candidates:
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            parts.append((path, obj))
    return parts


def _has_epoch(obj: Any) -> bool:
    return callable(getattr(obj, "set_epoch", None)) and type(getattr(obj, "epoch", None)) is int


def loader_state(loaders: Mapping[str, Any]) -> LoaderState:
    """The generators' states and the samplers' epochs and seeds, per loader name (CPU tensors, ints)."""
    state: LoaderState = {}
    for name, loader in loaders.items():
        entries: dict[str, Any] = {}
        for path, obj in _parts(inner_loader(loader)):
            generator = getattr(obj, "generator", None)
            if isinstance(generator, torch.Generator):
                entries[f"{path}.generator"] = generator.get_state()
            if _has_epoch(obj):
                entries[f"{path}.epoch"] = obj.epoch
                if type(getattr(obj, "seed", None)) is int:
                    entries[f"{path}.seed"] = obj.seed
        if entries:
            state[name] = entries
    return state


def warn_if_not_restorable(loaders: Mapping[str, Any]) -> None:
    """Warn about loaders whose randomness a checkpoint cannot hold (persistent worker processes)."""
    for name, loader in loaders.items():
        inner = inner_loader(loader)
        if getattr(inner, "persistent_workers", False) and getattr(inner, "num_workers", 0) > 0:
            warnings.warn(
                f"checkpoint: loader {name!r} keeps persistent worker processes; their random state "
                "(and the workers' base seed, drawn once for the loader's life) is not in the "
                "checkpoint, so a resumed run may draw other samples or augmentations than an "
                "uninterrupted one. Set persistent_workers=False for an exact resume.",
                RuntimeWarning,
                stacklevel=3,
            )


def _target(loaders: Mapping[str, Any], name: str, key: str) -> tuple[Any, str]:
    path, _, field = key.rpartition(".")
    for part_path, obj in _parts(inner_loader(loaders[name])):
        if part_path == path:
            return obj, field
    raise KeyError(key)


def mismatch(saved: Mapping[str, Mapping[str, Any]], loaders: Mapping[str, Any]) -> str | None:
    """Why ``saved`` cannot be put into ``loaders`` (None when it can)."""
    current = loader_state(loaders)
    want = {(name, key) for name, entries in saved.items() for key in entries}
    have = {(name, key) for name, entries in current.items() for key in entries}
    if want != have:

        def listing(state: Mapping[str, Mapping[str, Any]]) -> str:
            parts = [f"loader {name!r} ({', '.join(entries)})" for name, entries in state.items()]
            return "; ".join(parts) or "none"

        return (
            f"the checkpoint holds the random state of loaders: {listing(saved)}; this run's loaders "
            f"have: {listing(current)}. Build the loaders as the saving run did: the same names, "
            "shuffle=, generator= and sampler= (a loader's own generator, a sampler's generator, "
            "a DistributedSampler's epoch and seed)"
        )
    for name, entries in saved.items():
        for key, value in entries.items():
            now = current[name][key]
            if isinstance(now, torch.Tensor):
                if not (
                    isinstance(value, torch.Tensor) and value.shape == now.shape and value.dtype == now.dtype
                ):
                    return f"loader {name!r}'s {key} in the checkpoint is not a state of this run's generator"
            if not isinstance(now, torch.Tensor) and type(value) is not int:
                return f"loader {name!r}'s {key} in the checkpoint is {value!r}, not an int"
    return None


def set_loader_state(saved: Mapping[str, Mapping[str, Any]], loaders: Mapping[str, Any]) -> None:
    """Put back what :func:`loader_state` took (check it first with :func:`mismatch`)."""
    for name, entries in saved.items():
        for key, value in entries.items():
            obj, field = _target(loaders, name, key)
            if field == "generator":
                obj.generator.set_state(value)
            elif field == "epoch":
                obj.set_epoch(value)
            else:
                setattr(obj, field, value)
