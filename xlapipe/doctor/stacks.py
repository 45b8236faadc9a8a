"""Where a stopped script was: the threads' stacks faulthandler wrote when the doctor's --timeout ran out."""

from __future__ import annotations

import glob
import os
import re

from xlapipe.doctor.events import Frame, Record
from xlapipe.doctor.frames import user_frame
from xlapipe.doctor.probe import STACKS
from xlapipe.doctor.timeline import Timeline

_THREAD = re.compile(r"^(?:Current thread|Thread) 0x(?P<id>[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')


def read_stacks(path: str) -> dict[int, list[Frame]]:
    """Each thread's frames (innermost first) in one faulthandler dump, by thread id."""
    out: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if (m := _THREAD.match(line)) is not None:
                current = out.setdefault(int(m["id"], 16), [])
            elif current is not None and (m := _FRAME.match(line)) is not None:
                current.append(Frame(m["file"], int(m["line"]), m["function"]))
    return out


def where_stopped(folder: str, timeline: Timeline) -> Frame | None:
    """The user's line the training thread was at (the main thread's when no step was made)."""
    trained = next(
        (r.thread for r in timeline.records if isinstance(r, Record) and r.kind == "marker_end"), None
    )
    paths = sorted(glob.glob(os.path.join(folder, STACKS.format(pid="*"))))
    if timeline.pid:
        mine = os.path.join(folder, STACKS.format(pid=timeline.pid))
        paths = [mine] + [p for p in paths if p != mine]
    for path in paths:
        threads = read_stacks(path)
        order = ([threads[trained]] if trained in threads else []) + list(threads.values())
        for frames in order:
            frame = user_frame(frames, timeline.libraries)
            if frame is not None:
                return frame
    return None
