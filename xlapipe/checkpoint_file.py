"""The checkpoint file: what weights-only loading can read back, a digest of it, atomic writes.

A checkpoint is read with ``torch.load(weights_only=True)``, which refuses
arbitrary objects (a NumPy scalar, a ``datetime``, a ``pathlib.Path``...).
:func:`check_loadable` names such a value and its fix before anything is
written. :func:`digest` hashes a state's values (every tensor's bytes, every
number and string, in order), so a flipped byte in a stored tensor is caught
when the file is read. :func:`write_atomic` writes a temporary file beside the
target, checks it, and renames it over the target; it first removes the
temporaries that killed saves left in that folder.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import enum
import hashlib
import io
import os
import pathlib
import pickle
import re
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_TENSORS = (torch.Tensor, nn.Parameter)


# -- what weights-only loading reads back --------------------------------------------------


def _round_trips(value: Any) -> bool:
    """Whether ``torch.load(weights_only=True)`` reads ``value`` back (tried in memory)."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - any failure means: it does not round-trip
        return False
    return True


def _fix(value: Any) -> str:
    """What to store instead of ``value``, so that it loads."""
    module = type(value).__module__.split(".")[0]
    if module == "numpy":
        if type(value).__name__ == "ndarray":
            return "a tensor or a list (torch.from_numpy(value) or value.tolist())"
        return "a Python number (value.item())"
    if isinstance(value, datetime.timedelta):
        return "a number (value.total_seconds())"
    if isinstance(value, (datetime.date, datetime.time)):
        return "a string (value.isoformat())"
    if isinstance(value, pathlib.PurePath):
        return "a string (str(value))"
    if isinstance(value, argparse.Namespace):
        return "a dict (vars(value))"
    if isinstance(value, enum.Enum):
        return "its value or name (value.value, value.name)"
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return "a dict or a tuple (value._asdict(), tuple(value))"
    if isinstance(value, dict):
        return "a dict (dict(value))"
    if isinstance(value, torch.Tensor):
        return "a plain tensor (value.detach().clone().as_subclass(torch.Tensor))"
    return "plain data: numbers, strings, bytes, lists, tuples, dicts and tensors"


def _refuse(value: Any, where: str) -> None:
    kind = type(value)
    raise TypeError(
        f"checkpoint.save: {where} is of type {kind.__module__}.{kind.__qualname__}, which checkpoint.load "
        "cannot read back (it loads with torch.load(weights_only=True), which refuses arbitrary "
        f"objects). Store {_fix(value)} instead. Nothing was written; the previous checkpoint is kept."
    )


# -- one walk for both: checking and hashing -------------------------------------------------


def _feed_tensor(h: Any, t: torch.Tensor, where: str) -> None:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError) as error:
        raise TypeError(
            f"checkpoint: {where} is a {t.layout} {t.dtype} tensor whose bytes cannot be "
            f"read for the checkpoint's digest ({error}); store a dense tensor"
        ) from error
    h.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
    h.update(data)


def _walk(value: Any, where: str, h: Any | None) -> None:
    """Check that ``value`` loads back; with ``h``, feed its contents to the hash ``h``."""
    kind = type(value)
    if kind in _SCALARS:
        if h is not None:
            h.update(f"{kind.__name__}:".encode())
            h.update(value if kind is bytes else repr(value).encode())
            h.update(b";")
    elif kind in _TENSORS:
        if h is not None:
            _feed_tensor(h, value, where)
    elif kind is torch.Size or kind in _TORCH_VALUES:
        if h is not None:
            h.update(f"{kind.__name__}:{value!r};".encode())
    elif kind in (list, tuple):
        if h is not None:
            h.update(f"{kind.__name__}[{len(value)}:".encode())
        for i, item in enumerate(value):
            _walk(item, f"{where}[{i}]", h)
        if h is not None:
            h.update(b"]")
    elif kind in (dict, OrderedDict):
        if h is not None:
            h.update(f"{kind.__name__}{{{len(value)}:".encode())
        for key, item in value.items():
            _walk(key, f"a key of {where}", h)
            _walk(item, f"{where}[{key!r}]", h)
        extra_attributes = getattr(value, "__dict__", None)  # a state dict's _metadata
        if extra_attributes:
            _walk(dict(extra_attributes), f"{where}.__dict__", h)
        if h is not None:
            h.update(b"}")
    elif kind is set:
        parts = []
        for item in value:
            sub = hashlib.sha256() if h is not None else None
            _walk(item, f"an item of {where}", sub)
            if sub is not None:
                parts.append(sub.digest())
        if h is not None:  # a set's order differs between processes: hash it sorted
            h.update(f"set{{{len(value)}:".encode() + b"".join(sorted(parts)) + b"}")
    elif type(value).__module__.split(".")[0] != "numpy" and _round_trips(value):
        # e.g. a type the user allowed with torch.serialization.add_safe_globals
        if h is not None:
            h.update(f"{kind.__module__}.{kind.__qualname__}:".encode())
            h.update(pickle.dumps(value, protocol=4))
    else:
        _refuse(value, where)


def check_loadable(value: Any, where: str) -> None:
    """Raise TypeError, naming the value and the fix, if weights-only loading cannot read ``value``."""
    _walk(value, where, None)


def digest(value: Any, where: str = "the state") -> str:
    """A SHA-256 of ``value``'s contents (tensors' bytes, numbers, strings, structure), as hex."""
    h = hashlib.sha256()
    _walk(value, where, h)
    return h.hexdigest()


# -- atomic writes, and the temporaries of killed ones ----------------------------------------

_HOST = re.sub(r"\W", "_", socket.gethostname())[:64] or "host"
_TEMPORARY = re.compile(r"^\..+\.xlapipe-(?P<host>\w*)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")


def temporary_name(name: str) -> str:
    """``.<name>.xlapipe-<host>-<pid>-<random>.tmp``: who writes it is in the name."""
    return f".{name}.xlapipe-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id we can ask about: leave its file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove the temporaries of saves killed in ``folder``; return their names.

    A temporary is stale when it was written on this host (the host name is
    in its name) by a process that no longer exists (so is its id). Those of
    live processes, and of other hosts sharing the folder, are left alone.
    """
    removed = []
    with contextlib.suppress(OSError):
        names = os.listdir(folder)
        for name in names:
            match = _TEMPORARY.match(name)
            if match is None or match["host"] != _HOST or _alive(int(match["pid"])):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
                removed.append(name)
    return removed


def write_atomic(obj: Any, path: str | os.PathLike, check: Callable[[str], None] | None = None) -> None:
    """``torch.save(obj)`` to ``path`` so that ``path`` is always either old or new, whole.

    ``check(temporary_path)`` runs on the written, flushed file before it
    replaces ``path``; if it raises, the temporary is removed and ``path`` is
    left as it was.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
    tmp = os.path.join(folder, temporary_name(os.path.basename(path)))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (POSIX)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
