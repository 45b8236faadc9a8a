"""step_marker: a script that updates its model with no step marker at all (no torch_xla.sync()).

Without a marker nothing tells torch_xla where a step ends: every iteration is
traced onto the graph of the ones before it, which grows until a value is read
(then that read runs it), or until the script's end. The doctor counts the
optimizer updates instead of steps, and says where the marker goes.
"""

from __future__ import annotations

from collections import Counter

from xlapipe.doctor.checks.host_reads import SHOWN
from xlapipe.doctor.events import Analysis, Event, Record
from xlapipe.doctor.findings import Finding, plural
from xlapipe.doctor.frames import Libraries, short, source, user_frame

FIX = (
    "add torch_xla.sync() right after {update} (here: after line {line}); or wrap the step in "
    "`with torch_xla.step():`, or iterate over torch_xla's MpDeviceLoader, which marks each step; "
    "xlapipe's run.step marks it too"
)


def updates(events: list[Event]) -> list[Record]:
    """The optimizer updates the probe noted before any step marker ran a graph."""
    return [e for e in events if isinstance(e, Record) and e.kind == "update"]


def check(events: list[Event], libraries: Libraries, warmup: int, cwd: str) -> Finding | None:
    """The finding for a process that updated its model ``warmup`` + 2 times or more and marked no step."""
    noted = updates(events)
    if len(noted) < warmup + 2:
        return None
    first = noted[warmup].data.get("n")
    last = noted[-1].data.get("n")
    measured = len(noted) - warmup - 1  # the intervals between the updates after warm-up
    site = Counter(user_frame(r.frames(), libraries) for r in noted).most_common(1)[0][0]
    compiles: list[Analysis] = []
    executions: list[Analysis] = []
    reads: list[Record] = []
    inside = False
    for e in events:
        if isinstance(e, Record) and e.kind == "update":
            n = e.data.get("n")
            inside = first is not None and last is not None and first <= n < last
        elif inside and isinstance(e, Analysis):
            (compiles if e.kind == "compile" else executions).append(e)
        elif inside and isinstance(e, Record) and e.kind == "read":
            reads.append(e)
    ran = Counter(user_frame(a.frames, libraries) for a in executions)
    if ran:
        at, n = ran.most_common(1)[0]
        how = sorted({SHOWN.get(str(r.data.get("func")), str(r.data.get("func"))) for r in reads})
        what = (
            f"each iteration's work ran at {short(at, cwd)} ({source(at)}"
            + (f": {', '.join(how)}" if how else "")
            + f"), {plural(n / measured, 'time')} per update, not at a step marker; "
            f"{plural(len(compiles) / measured, 'compilation')} per update"
        )
    else:
        what = (
            "nothing ran in these updates: each iteration is traced onto one graph that keeps "
            "growing until a value is read or the script ends"
        )
    update = source(site).split("  #")[0] or "the optimizer step"
    return Finding(
        "step_marker",
        short(site, cwd),
        count=1.0,
        cost_s=None,
        detail=f"{plural(measured + 1, 'optimizer update')} after warm-up and no step marker "
        f"(torch_xla.sync(), MpDeviceLoader, torch_xla.step()): {what}",
        fix=FIX.format(update=update, line=site.line if site else "?"),
        code=source(site),
    )
