"""Batches as nested structures of tensors: walked, moved and rebuilt with their types kept."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it, in a fixed order.

    Walks dicts and other mappings, lists, tuples, named tuples and dataclasses,
    and rebuilds each with its own type (a mapping type that cannot be rebuilt
    from a dict becomes a dict). Anything else is kept as it is.
    """

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, Mapping):
            moved = {k: walk(v) for k, v in value.items()}
            rebuild: Any = type(value)  # a concrete mapping type, most often dict
            try:
                return rebuild(moved)
            except TypeError:
                return moved
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
            return type(value)(*map(walk, value))
        if isinstance(value, (list, tuple)):
            return type(value)(map(walk, value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(
                value, **{f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            )
        return value

    return walk(batch)


def tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in ``batch``, in :func:`map_tensors`' order."""
    found: list[torch.Tensor] = []
    map_tensors(batch, found.append)
    return found


def to_device(batch: Any, device: torch.device, float_dtype: torch.dtype | None = None) -> Any:
    """``batch`` with every tensor in it on ``device`` (floating ones cast to ``float_dtype``)."""

    def move(t: torch.Tensor) -> torch.Tensor:
        dtype = float_dtype if float_dtype is not None and t.is_floating_point() else t.dtype
        return t.to(device=device, dtype=dtype)

    return map_tensors(batch, move)
