"""Process-wide effects as values, applied through one context that restores them.

A transform never sets an environment variable or a torch default itself: it
records an effect in the setup, and :func:`applied` performs the effects in
order and undoes them in reverse, on normal exit and when the body raises.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
from attrs import field, frozen
from attrs.validators import in_, instance_of

from xlapipe import runtime

Restore = Callable[[], None]

DTYPES = ("float32", "float64", "bfloat16", "float16")


class Effect(Protocol):
    """A change to process-wide state that knows how to undo itself."""

    @property
    def before_runtime(self) -> bool:
        """True when the effect must be in force before the XLA runtime starts (read-only)."""
        ...

    def apply(self) -> Restore: ...

    def describe(self) -> dict: ...


def _put_back(name: str, old: str | None) -> Restore:
    """The restore that puts environment variable ``name`` back to ``old`` (unset when None)."""

    def restore() -> None:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old

    return restore


@frozen
class EnvVar:
    """Set an environment variable; ``before_runtime`` ones must precede the XLA runtime."""

    name: str = field(validator=instance_of(str))
    value: str = field(validator=instance_of(str))
    before_runtime: bool = True

    def apply(self) -> Restore:
        old = os.environ.get(self.name)
        in_force = runtime.started_with().get(self.name, old)  # what the running runtime read
        if self.before_runtime and in_force != self.value and runtime.started():
            raise RuntimeError(
                f"{self.name}={self.value} is read once when torch_xla's runtime "
                "starts, and the runtime has already started in this process. "
                "Apply the setup's effects before anything touches the XLA device "
                "(xlapipe.session does this), or run in a fresh process."
            )
        os.environ[self.name] = self.value
        return _put_back(self.name, old)

    def describe(self) -> dict:
        return {"effect": "env", "name": self.name, "value": self.value}


@frozen
class KeepEnv:
    """An environment variable put back as the session found it: one a library sets while the
    session runs (``torch.compile`` sets ``TORCHINDUCTOR_CACHE_DIR``)."""

    name: str = field(validator=instance_of(str))
    before_runtime: bool = False

    def apply(self) -> Restore:
        return _put_back(self.name, os.environ.get(self.name))

    def describe(self) -> dict:
        return {"effect": "keep_env", "name": self.name}


@frozen
class DefaultDtype:
    """``torch.set_default_dtype`` for the duration of the context."""

    dtype: str = field(default="float32", validator=in_(DTYPES))
    before_runtime: bool = False

    def apply(self) -> Restore:
        old = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, self.dtype))
        return lambda: torch.set_default_dtype(old)

    def describe(self) -> dict:
        return {"effect": "default_dtype", "dtype": self.dtype}


@frozen
class DefaultDevice:
    """``torch.set_default_device``; ``"xla"`` means this replica's XLA device."""

    device: str = field(validator=in_(("cpu", "xla")))
    before_runtime: bool = False

    def apply(self) -> Restore:
        old = torch.get_default_device()
        torch.set_default_device(runtime.device() if self.device == "xla" else "cpu")
        return lambda: torch.set_default_device(old)

    def describe(self) -> dict:
        return {"effect": "default_device", "device": self.device}


class _Applied:
    """One ``applied`` context's restores, undone in reverse order, once."""

    def __init__(self) -> None:
        self.restores: list[Restore] = []
        self.exited = False

    def undo(self) -> None:
        errors = []
        while self.restores:
            try:
                self.restores.pop()()
            except Exception as error:  # noqa: BLE001 - restore the rest, raise the first
                errors.append(error)
        if errors:
            raise errors[0]


_ACTIVE: list[_Applied] = []  # the contexts in force, oldest first
_LOCK = threading.Lock()


@contextlib.contextmanager
def applied(effects: Iterable[Effect]) -> Iterator[None]:
    """Apply ``effects`` (environment first), undo them all on exit or error.

    An effect listed twice (equal values) is applied once. Contexts that
    overlap (two sessions) may end in any order: one that ends
    while a later one is still in force is undone when the later one ends,
    so each restores what was there before it and nothing is left changed.
    """
    unique: list[Effect] = []
    for effect in effects:  # two practices may need one effect (scan_layers and compile_step)
        if effect not in unique:
            unique.append(effect)
    ordered = sorted(unique, key=lambda e: not e.before_runtime)
    mine = _Applied()
    with _LOCK:
        _ACTIVE.append(mine)
    try:
        for effect in ordered:
            mine.restores.append(effect.apply())
        yield
    except BaseException as error:
        for also in _exit(mine):  # the body's error is the one to see
            note(error, f"while restoring process-wide settings after it: {type(also).__name__}: {also}")
        raise
    errors = _exit(mine)
    if errors:
        raise errors[0]


def _exit(mine: _Applied) -> list[Exception]:
    """Mark ``mine`` exited and undo every context that can be undone now; the errors met."""
    with _LOCK:
        mine.exited = True
        ready = []
        while _ACTIVE and _ACTIVE[-1].exited:
            ready.append(_ACTIVE.pop())
    errors = []
    for context in ready:  # newest first: each puts back what was there before it
        try:
            context.undo()
        except Exception as error:  # noqa: BLE001
            errors.append(error)
    return errors


def note(error: BaseException, text: str) -> None:
    """Add ``text`` to ``error``'s notes (shown under its traceback), without replacing it."""
    if hasattr(error, "add_note"):  # Python 3.11+
        error.add_note(text)
    else:
        import warnings

        warnings.warn(text, RuntimeWarning, stacklevel=3)


# torch_xla sets this around its JAX imports and, when two threads race there,
# leaves it set (torch_xla/_internal/jax_workarounds.py); it is not ours to restore.
TORCH_XLA_OWN = frozenset({"SKIP_MEGASCALE_PJRT_CLIENT"})


def snapshot() -> dict:
    """The process-wide state xlapipe may touch, for before/after comparisons."""
    return {
        "environ": {k: v for k, v in os.environ.items() if k not in TORCH_XLA_OWN},
        "default_dtype": torch.get_default_dtype(),
        "default_device": torch.get_default_device(),
    }
