"""Validators for practices' parameters: attrs validators whose errors name the practice and the fix.

>>> @frozen
... class Clip(Hook):
...     max_norm: float = field(validator=checks.positive_number("clip_grad_norm", "max_norm"))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

Validator = Callable[[Any, Any, Any], None]


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(owner: str, name: str, kind: str, value: object, detail: str = "") -> None:
    raise ValueError(f"{owner}: {name} must be {kind}{detail}, got {value!r}")


def positive_int(owner: str, name: str, detail: str = "", optional: bool = False) -> Validator:
    """An int of at least 1 (or None, when ``optional``)."""

    def check(_: object, __: object, value: object) -> None:
        if not ((optional and value is None) or (is_int(value) and value >= 1)):  # type: ignore[operator]
            _refuse(owner, name, "a positive int" + (" or None" if optional else ""), value, detail)

    return check


def non_negative_int(owner: str, name: str, detail: str = "") -> Validator:
    """An int of at least 0."""

    def check(_: object, __: object, value: object) -> None:
        if not (is_int(value) and value >= 0):  # type: ignore[operator]
            _refuse(owner, name, "a non-negative int", value, detail)

    return check


def flag(owner: str, name: str) -> Validator:
    """True or False."""

    def check(_: object, __: object, value: object) -> None:
        if not isinstance(value, bool):
            _refuse(owner, name, "True or False", value)

    return check


def number_in(owner: str, name: str, low: float, high: float, detail: str = "") -> Validator:
    """A finite number strictly between ``low`` and ``high``."""

    def check(_: object, __: object, value: object) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not low < value < high
        ):
            _refuse(owner, name, f"a number between {low:g} and {high:g}", value, detail)

    return check


def one_of(owner: str, name: str, choices: Collection[object], detail: str = "") -> Validator:
    """One of ``choices``."""

    def check(_: object, __: object, value: object) -> None:
        if value not in choices:
            options = [repr(c) for c in choices]
            listed = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
            _refuse(owner, name, listed, value, detail)

    return check


def text(owner: str, name: str) -> Validator:
    """A non-empty string."""

    def check(_: object, __: object, value: object) -> None:
        if not isinstance(value, str) or not value:
            _refuse(owner, name, "a non-empty string", value)

    return check
