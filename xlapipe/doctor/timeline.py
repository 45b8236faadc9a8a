"""A diagnosed run as steps: what each step ran, compiled, read, transferred and waited for.

A step is the work that ends at a step marker that runs a graph: ``torch_xla.sync()``
(which ``xm.mark_step()``, an ``MpDeviceLoader`` batch, ``xm.optimizer_step(barrier=True)``
and xlapipe's ``run.step`` call) in the thread that first ran one. A marker with
nothing to run (the device loader's first, ``torch_xla.compile``'s opening one)
ends no step. What happens after the last step (an evaluation cut short, the
script's end) belongs to no step.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import define, field

from xlapipe.doctor.events import Analysis, Event, Frame, Record
from xlapipe.doctor.frames import Libraries, by_compiled_region, user_frame


@define
class Compile:
    """One compilation: torch_xla's analysis, whether the step marker ran it, its seconds."""

    analysis: Analysis
    at_marker: bool
    seconds: float | None = None


@define
class Step:
    """One step (1-based ``index``) and everything noted in it."""

    index: int
    step_s: float = 0.0  # from the end of the previous step to the end of this one
    sync_s: float = 0.0  # inside the step marker that ended it
    wait_s: float = 0.0  # waiting for a batch
    updates: int = 0  # optimizer steps
    site: Frame | None = None  # the user's line the step marker was called from
    loader_site: Frame | None = None  # the user's line the last batch was asked for from
    device_loader: bool = False  # the last batch came through torch_xla's MpDeviceLoader
    queued: int | None = None  # batches ready in the device loader's queues when it was asked
    loader_ended: bool = False  # its host loader had given its last batch by then (the epoch's end)
    compiles: list[Compile] = field(factory=list)
    executions: list[tuple[Analysis, bool]] = field(factory=list)  # (analysis, run by the step marker)
    reads: list[Record] = field(factory=list)  # device values read on the host, CPU fallbacks
    transfers: list[Record] = field(factory=list)  # host tensors copied to the device outside the loader
    fallbacks: dict[str, float] = field(factory=dict)  # torch_xla's CPU-fallback counters' increase
    values: list[Record] = field(factory=list)  # Python numbers of a torch call that changed since its last


@define
class Timeline:
    """The steps of the process that trained, and its records outside the steps."""

    pid: int
    steps: list[Step]
    records: list[Record]  # every record of the process (start, runtime, params, deprecated, ...)
    libraries: Libraries
    graphs: dict[str, str] = field(factory=dict)  # IR text by graph hash

    def first(self, kind: str) -> Record | None:
        return next((r for r in self.records if r.kind == kind), None)

    def all(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]

    def where(self, frames: Iterable[Frame]) -> Frame | None:
        return user_frame(frames, self.libraries)


def training_thread(events: Iterable[Event]) -> int | None:
    """The thread whose step markers count: the first to run a graph at one."""
    return next(
        (e.thread for e in events if isinstance(e, Record) and e.kind == "marker_end" and e.data.get("step")),
        None,
    )


def build(pid: int, events: list[Event], libraries: Libraries) -> Timeline:
    """Cut one process's events into steps."""
    thread = training_thread(events)
    records = [e for e in events if isinstance(e, Record)]
    timeline = Timeline(pid, [], records, libraries)
    current = Step(1)
    at_marker = False
    begin: dict[str, float] = {}  # the CPU-fallback counters when the last step ended
    marker_fallbacks: dict[str, float] = {}
    for event in events:
        if isinstance(event, Analysis):
            if event.kind == "execute" and by_compiled_region(event.frames):
                continue  # a compiled region's own graphs: the step's work, however it is cut
            if event.kind == "compile":
                current.compiles.append(Compile(event, at_marker))
            else:
                current.executions.append((event, at_marker))
            continue
        mine = thread is None or event.thread == thread
        if event.kind == "marker" and mine:
            at_marker = True
            marker_fallbacks = event.data.get("fallbacks") or {}
            current.site = timeline.where(event.frames())
        elif event.kind == "marker_end" and mine:
            at_marker = False
            if not event.data.get("step"):
                continue
            _close(current, event, timeline, begin, marker_fallbacks)
            begin = marker_fallbacks
            timeline.steps.append(current)
            current = Step(current.index + 1)
        elif event.kind in ("read", "transfer") and mine and not by_compiled_region(event.frames()):
            (current.reads if event.kind == "read" else current.transfers).append(event)
        elif event.kind == "value" and mine:
            current.values.append(event)
    return timeline


def _close(step: Step, end: Record, timeline: Timeline, begin: dict, now: dict) -> None:
    data = end.data
    step.step_s = float(data.get("step_s", 0.0))
    step.sync_s = float(data.get("sync_s", 0.0))
    step.wait_s = float(data.get("wait_s", 0.0))
    step.updates = int(data.get("updates", 0))
    step.loader_site = timeline.where(end.frames("loader_stack"))
    step.device_loader = any("parallel_loader" in f.file for f in end.frames("loader_stack"))
    queued = data.get("queued")
    if isinstance(queued, list) and len(queued) == 3:
        step.queued, step.loader_ended = int(queued[0]), bool(queued[2])
    seconds = list(data.get("compile_s") or [])
    if len(seconds) == len(step.compiles):
        for compiled, s in zip(step.compiles, seconds):
            compiled.seconds = float(s)
    step.fallbacks = {op: n - begin.get(op, 0.0) for op, n in now.items() if n > begin.get(op, 0.0)}
