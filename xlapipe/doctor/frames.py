"""Which frame of a stack is the user's line: never torch's, torch_xla's, xlapipe's or Python's own."""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterable, Mapping

from attrs import frozen

from xlapipe.doctor.events import Frame

_USER_PSEUDO_FILES = ("<stdin>", "<string>")


@frozen
class Libraries:
    """Where the diagnosed interpreter's libraries live (the probe's ``start`` record says)."""

    own: tuple[str, ...] = ()  # torch, torch_xla, xlapipe
    python: tuple[str, ...] = ()  # the standard library
    third_party: tuple[str, ...] = ()  # site-packages

    @classmethod
    def from_record(cls, data: Mapping[str, Iterable[str]] | None) -> Libraries:
        data = data or {}

        def dirs(key: str) -> tuple[str, ...]:
            return tuple(sorted({os.path.join(os.path.realpath(p), "") for p in data.get(key, ()) if p}))

        return cls(dirs("own"), dirs("python"), dirs("third_party"))

    def kind(self, file: str) -> str:
        """ "user", "third_party" or "library" (torch, torch_xla, xlapipe, Python's own, generated code)."""
        if file.startswith("<"):
            return "user" if file in _USER_PSEUDO_FILES else "library"
        path = os.path.realpath(file)
        if path.startswith(self.own):
            return "library"
        if path.startswith(self.third_party):  # checked before Python's own: site-packages may be inside it
            return "third_party"
        return "library" if path.startswith(self.python) else "user"


def user_frame(frames: Iterable[Frame], libraries: Libraries) -> Frame | None:
    """The innermost frame of the user's own code; else of a third-party library; else None."""
    third_party = None
    for frame in frames:
        kind = libraries.kind(frame.file)
        if kind == "user":
            return frame
        if kind == "third_party" and third_party is None:
            third_party = frame
    return third_party


_BRIDGE = os.path.join("torch_xla", "_dynamo", "")


def by_compiled_region(frames: Iterable[Frame]) -> bool:
    """Whether torch_xla's bridge for torch.compile did it: running a compiled region, not the script."""
    return any(_BRIDGE in frame.file for frame in frames)


def source(frame: Frame | None) -> str:
    """The text of the frame's line, stripped ('' when unreadable)."""
    return linecache.getline(frame.file, frame.line).strip() if frame is not None else ""


def short(frame: Frame | None, cwd: str = "") -> str:
    """``file:line``, the file relative to ``cwd`` when it is inside it."""
    if frame is None:
        return ""
    path = frame.file
    if cwd and os.path.isabs(path):
        rel = os.path.relpath(path, cwd)
        path = rel if not rel.startswith("..") else path
    return f"{path}:{frame.line}"
