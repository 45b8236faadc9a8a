"""A finding, and what every check reads: the steps after warm-up, grouped by the user's line."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from attrs import define, frozen

from xlapipe.doctor.events import Frame, Record
from xlapipe.doctor.frames import short, source
from xlapipe.doctor.timeline import Step, Timeline

# torch's own frames between a tensor operation the user wrote and what it runs: not library code
_DISPATCH = tuple(
    os.path.join("torch", name)
    for name in (
        "_tensor.py",
        "overrides.py",
        "_tensor_str.py",
        os.path.join("autograd", "__init__.py"),
        os.path.join("autograd", "graph.py"),
        "functional.py",
    )
)
KINDS = (
    "optimizer",
    "step_marker",
    "recompile",
    "host_read",
    "cpu_fallback",
    "input_bound",
    "executions",
    "setup",
)
T = TypeVar("T")


@frozen
class Finding:
    """One thing that slows the script down: where, how often, what it costs, and the fix."""

    kind: str  # one of KINDS
    where: str  # file:line of the user's frame ('' when it has no one line, e.g. the environment)
    count: float  # times per step (after warm-up); 1 for a setup finding
    cost_s: float | None  # estimated seconds lost per step (None: not measurable here)
    detail: str
    fix: str
    practice: dict[str, Any] | None = None  # the transform that fixes it: {"name": ..., "params": {...}}
    code: str = ""  # the text of the line at ``where``
    ranks: tuple[int, ...] = ()  # the replicas it was found in, when the script started processes

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "where": self.where,
            "count": round(self.count, 3),
            "cost_s": None if self.cost_s is None else round(self.cost_s, 6),
            "detail": self.detail,
            "fix": self.fix,
            "practice": self.practice,
            "code": self.code,
            "ranks": list(self.ranks),
        }


@define
class Context:
    """What the checks read: the run's timeline, the warm-up, and how the script is built."""

    timeline: Timeline
    warmup: int
    cwd: str
    practices: list[dict[str, Any]] | None  # the xlapipe practices on (None: a plain torch_xla script)
    _files: dict[str, str] | None = None  # the run's files by base name (for IR locations)

    @property
    def measured(self) -> list[Step]:
        """The steps after warm-up: what the findings are about."""
        return self.timeline.steps[self.warmup :]

    @property
    def median_step_s(self) -> float:
        """The measured steps' median time: the header's figure, which findings quote too."""
        times = sorted(s.step_s for s in self.measured)
        n = len(times)
        return 0.0 if not n else times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2

    @property
    def uses_xlapipe(self) -> bool:
        return self.practices is not None

    def has(self, name: str) -> bool:
        return any(p.get("name") == name for p in self.practices or ())

    def where(self, frame: Frame | None) -> str:
        return short(frame, self.cwd)

    def frame_of(self, record: Record, key: str = "stack") -> Frame | None:
        return self.timeline.where(record.frames(key))

    def frame_at(self, location: str) -> Frame | None:
        """The frame of an IR location (``function@file.py:12``): a file of the run's stacks by that name."""
        from xlapipe.doctor.graphs import location_line

        place = location_line(location)
        if place is None:
            return None
        name, line = place
        if self._files is None:
            files: dict[str, str] = {}
            for record in self.timeline.records:
                for frame in record.frames():
                    files.setdefault(os.path.basename(frame.file), frame.file)
            self._files = files
        path = self._files.get(name)
        if path is None:
            return None
        function = location.rpartition("@")[0]
        frame = Frame(path, line, function)
        return frame if self.timeline.libraries.kind(path) == "user" else None

    def in_library(self, record: Record) -> bool:
        """Whether it happened inside a library's code (torch's clip_grad_norm_, transformers), not
        in an operation the user's line asked for."""
        return self.library_frame(record) is not None

    def library_frame(self, record: Record) -> Frame | None:
        """The library frame a record happened in: the innermost third-party frame (the package the
        user called, e.g. transformers), else the innermost library frame; None when the frames
        between the user's line and the call are only torch's tensor dispatch (``print(t)``,
        ``float(t)``, ``t.backward()``)."""
        inner = []
        for frame in record.frames():
            if self.timeline.libraries.kind(frame.file) == "user":
                break
            if not frame.file.endswith(_DISPATCH):
                inner.append(frame)
        third = [f for f in inner if self.timeline.libraries.kind(f.file) == "third_party"]
        return third[0] if third else (inner[0] if inner else None)

    def per_step(self, total: float) -> float:
        return total / len(self.measured) if self.measured else 0.0

    def finding(self, kind: str, frame: Frame | None, **fields: Any) -> Finding:
        return Finding(kind, self.where(frame), code=source(frame), **fields)


def spent_s(read: Record) -> float:
    """Seconds a read or fallback took, less the compiling it caused (a recompile finding counts that)."""
    return float(read.data.get("spent_s", 0.0)) - float(read.data.get("compile_s", 0.0))


def compiling_s(reads: Iterable[Record]) -> str:
    """``"; plus 1.2 s compiling its graphs (under recompile)"`` when the reads compiled."""
    total = sum(float(r.data.get("compile_s", 0.0)) for r in reads)
    return f"; besides, {seconds(total)} of compiling its graphs (counted under recompile)" if total else ""


def group(items: Iterable[T], key: Callable[[T], Any]) -> dict[Any, list[T]]:
    """``items`` by ``key``, in the order first seen."""
    out: dict[Any, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def plural(n: float, word: str) -> str:
    """``"1 graph"``, ``"2 graphs"``, ``"0.5 reads"``."""
    text = f"{n:g}" if n == int(n) else f"{n:.2g}"
    return f"{text} {word}{'' if n == 1 else 's'}"


def seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 0.001:
        return f"{s * 1e6:.0f} us"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"
