"""Typed ``tuple`` converters for attrs fields.

``converter=tuple`` works at run time, but a type checker reads it as taking an
``Iterable`` of an unbound type; these say what each field takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def strs(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def ints(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)


def name_sets(items: Iterable[frozenset[str]]) -> tuple[frozenset[str], ...]:
    return tuple(items)


def records(items: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(items)
