"""Reading a diagnosed run's files: torch_xla's analyses, the probe's records, the graphs' IR.

One trace file per process holds, in the order they happened, torch_xla's
"Compilation Analysis" and "Execution Analysis" blocks (``PT_XLA_DEBUG_LEVEL=2``)
and the probe's ``xlapipe-doctor {json}`` records. The graphs files
(``XLA_SAVE_TENSORS_FILE``) hold the IR of every graph run, by graph hash.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from typing import Any

from attrs import frozen

from xlapipe.doctor.probe import GRAPHS, PREFIX, TRACE

_FRAME = re.compile(r"^\s+(?P<function>\S+) \((?P<file>.*):(?P<line>\d+)\)$")
_ANALYSES = {"Compilation Analysis: ": "compile", "Execution Analysis: ": "execute"}


@frozen
class Frame:
    """One Python frame: where in which file, in which function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@frozen
class Analysis:
    """torch_xla's account of one compilation or execution: why, which graph, from which frames."""

    kind: str  # "compile" or "execute"
    cause: str
    graph: str  # the graph hash
    frames: tuple[Frame, ...]  # innermost first


@frozen
class Record:
    """One record the probe wrote."""

    kind: str
    data: dict[str, Any]

    @property
    def thread(self) -> int:
        return int(self.data.get("thread", 0))

    def frames(self, key: str = "stack") -> tuple[Frame, ...]:
        return tuple(Frame(str(f), int(n), str(fn)) for f, n, fn in self.data.get(key) or ())


Event = Analysis | Record


def trace_files(folder: str) -> dict[int, str]:
    """The trace file of each process of the run, by process id."""
    pattern = re.compile(re.escape(TRACE).replace(r"\{pid\}", r"(\d+)") + "$")
    out = {}
    for path in glob.glob(os.path.join(folder, TRACE.format(pid="*"))):
        m = pattern.search(os.path.basename(path))
        if m:
            out[int(m.group(1))] = path
    return out


def read_events(path: str) -> list[Event]:
    """The events of one trace file, in order (a last line cut short is left out)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return list(_events(f))


def _events(lines: Any) -> Iterator[Event]:
    import json

    block: list[str] = []
    kind = ""
    for raw in lines:
        if not raw.endswith("\n"):
            return  # being written
        line = raw.rstrip("\n")
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX) :])
            except json.JSONDecodeError:
                continue
            yield Record(str(data.get("kind")), data)
            continue
        head = next((h for h in _ANALYSES if line.startswith(h)), None)
        if head is None:
            continue
        body = line[len(head) :]
        if set(body.strip()) == {"="}:
            if block:
                yield _analysis(_ANALYSES[head], block)
                block = []
            kind = _ANALYSES[head]
            continue
        if kind:
            block.append(body)


def _analysis(kind: str, body: list[str]) -> Analysis:
    cause, graph, frames = "", "", []
    for i, line in enumerate(body):
        text = line.strip()
        if text.endswith("Cause") and i + 1 < len(body):
            cause = body[i + 1].strip()
        elif text.startswith("Graph Hash:"):
            graph = text.split(":", 1)[1].strip()
        elif (m := _FRAME.match(line)) is not None:
            frames.append(Frame(m["file"], int(m["line"]), m["function"]))
    return Analysis(kind, cause, graph, tuple(frames))


def read_graphs(folder: str, pid: int) -> dict[str, str]:
    """The IR text of each graph process ``pid`` ran, by graph hash (the first time it ran)."""
    graphs: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(folder, GRAPHS.format(pid=pid) + ".*"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            ir: list[str] = []
            inside = False
            for line in f:
                if line.startswith("IR {"):
                    inside, ir = True, []
                elif inside and line.startswith("}"):
                    inside = False
                elif inside:
                    ir.append(line.rstrip("\n"))
                elif line.startswith("Graph Hash:"):
                    graphs.setdefault(line.split(":", 1)[1].strip(), "\n".join(ir))
    return graphs
