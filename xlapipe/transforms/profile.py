"""profile: a torch_xla profiler trace of a window of steps after warm-up, and where the time went.

Tracing from the first step (the usual mistake) records compilation, not
training. ``profile(steps=(10, 15), out="profile")`` starts torch_xla's
profiler (``torch_xla.debug.profiler.start_trace``) when step 10 begins and
stops it once step 15 has been executed on the device (at the next step's
start, when the device loader marks steps, or when the epoch or session ends).
It writes, under ``out``:

- ``plugins/profile/<time>/<host>.xplane.pb`` and ``.trace.json.gz``: the
  trace. Open the ``.trace.json.gz`` in Perfetto (https://ui.perfetto.dev,
  "Open trace file"), or run ``tensorboard --logdir OUT`` with the
  ``tensorboard-plugin-profile`` package for TensorBoard's profile plugin
  (trace viewer, op profile).
- ``summary.md``: the window's steps, wall time per step, torch_xla's own
  figures over the window (compilations, executions, execute and transfer
  time) and the trace events that took the most time.

On the CPU runtime the trace holds the host's side: Python-issued
``StepMarker``/``SyncTensorsGraph`` spans, XLA's compile passes, transfers,
and the CPU "device" executing. On a TPU it adds the device's own timeline
(every HLO op, its duration and TPU utilisation) and idle gaps between steps.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import time
import warnings
from typing import Any

import torch
from attrs import frozen

from xlapipe import claims, metrics, runtime
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.transform import Transform, practice, register

_TOP = 12


class ProfileWarning(RuntimeWarning):
    """The profile window was never reached: no trace was written."""


@frozen
class ProfileWindow(Hook):
    """The practice's parameters and its hook: trace steps ``steps[0]`` to ``steps[1]`` (1-based,
    inclusive) into ``out``."""

    steps: tuple[int, int]
    out: str

    @property
    def start_step(self) -> int:
        return self.steps[0]

    @property
    def stop_step(self) -> int:
        return self.steps[1]

    def start(self, run: Context) -> Hook:
        return _Profiling(self, run)


class _Profiling(Hook):
    def __init__(self, window: ProfileWindow, run: Context) -> None:
        self.window, self.run = window, run
        self.on_xla = run.device.type == "xla"
        out = os.path.abspath(os.path.expanduser(window.out))
        if self.on_xla and runtime.world_size() > 1:  # one trace per replica
            import torch_xla.runtime as xr

            out = os.path.join(out, f"replica-{xr.global_ordinal()}")
        self.out = out
        self.tracing = False
        self.done = False
        self.first: dict[str, Any] = {}

    def before_step(self, batch: Any) -> Any:
        step = self.run.steps + 1  # the step about to run
        if self.tracing and step > self.window.stop_step:
            self._stop()
        elif not self.tracing and not self.done and step == self.window.start_step:
            self._start()
        return batch

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        if self.tracing and self.run.steps >= self.window.stop_step and not self.run.marks_step_elsewhere:
            self._stop()  # this step's marker has run it already

    def end_epoch(self) -> None:
        if self.tracing:
            self._stop()

    def close(self) -> None:
        if self.tracing:
            self._stop()
        elif not self.done and not self.run.failed:
            warnings.warn(
                f"profile: the run ended after {self.run.steps} steps, before the window "
                f"(steps {self.window.start_step} to {self.window.stop_step}) began; no trace was written "
                f"to {self.out}. Choose a window inside the run (profile(steps=(start, stop))).",
                ProfileWarning,
                stacklevel=4,
            )

    def _start(self) -> None:
        import torch_xla.debug.profiler as xp

        os.makedirs(self.out, exist_ok=True)
        metrics.wait_for_device(self.on_xla)
        self.first = {"steps": self.run.steps, "time": time.perf_counter(), **metrics.xla_figures()}
        try:
            xp.start_trace(self.out)
        except RuntimeError as error:
            raise RuntimeError(
                f"profile: torch_xla could not start a trace ({error}); only one trace can run in a "
                "process at a time: stop the other (torch_xla.debug.profiler.stop_trace())"
            ) from error
        self.tracing = True

    def _stop(self) -> None:
        import torch_xla.debug.profiler as xp

        self.tracing, self.done = False, True
        metrics.wait_for_device(self.on_xla)
        last = {"steps": self.run.steps, "time": time.perf_counter(), **metrics.xla_figures()}
        xp.stop_trace()
        text = summary(self.first, last, self.out)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write(text)


def trace_totals(out: str) -> tuple[str | None, list[tuple[str, float, int]]]:
    """The newest trace under ``out`` and its events' total time (ms) and count, largest first."""
    found = sorted(
        glob.glob(os.path.join(out, "plugins", "profile", "*", "*.trace.json.gz")), key=os.path.getmtime
    )
    if not found:
        return None, []
    with gzip.open(found[-1], "rt") as f:
        events = json.load(f).get("traceEvents", [])
    total: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            total[e["name"]] += e["dur"] / 1000.0
            count[e["name"]] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1])
    return found[-1], [(name, ms, count[name]) for name, ms in ranked]


def summary(first: dict[str, Any], last: dict[str, Any], out: str) -> str:
    """Markdown: the window, torch_xla's figures over it, and the heaviest trace events."""
    steps = int(last["steps"] - first["steps"])
    wall = last["time"] - first["time"]
    delta = {
        k: last[k] - first[k]
        for k in ("compiles", "compile_s", "execute_s", "transfer_to_device_s", "mark_steps")
    }
    trace, events = trace_totals(out)
    lines = [
        f"# Profile of steps {first['steps'] + 1} to {last['steps']}",
        "",
        f"{steps} steps in {wall:.3f} s: {1000 * wall / max(steps, 1):.1f} ms per step.",
        "",
        "| torch_xla, over the window | |",
        "|---|---|",
        f"| compilations | {delta['compiles']:g} ({delta['compile_s']:.3f} s) |",
        f"| step markers | {delta['mark_steps']:g} |",
        f"| time executing on the device | {delta['execute_s']:.3f} s ({100 * delta['execute_s'] / wall:.0f}% of the wall time) |"
        if wall > 0
        else "| time executing on the device | n/a |",
        f"| time transferring to the device | {delta['transfer_to_device_s']:.3f} s |",
        "",
    ]
    if delta["compiles"]:
        lines += [
            "The window holds compilations: the trace shows compiling, not steady-state steps. "
            "Start it later (after the shapes have all been seen).",
            "",
        ]
    if trace:
        lines += [
            f"Trace: `{os.path.relpath(trace, out)}` (open it in https://ui.perfetto.dev, or "
            f"`tensorboard --logdir {out}` with tensorboard-plugin-profile).",
            "",
            "| trace event | total ms | count |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {ms:.2f} | {n} |" for name, ms, n in events[:_TOP]]
    else:
        lines += ["torch_xla wrote no trace file."]
    return "\n".join(lines) + "\n"


@register
def profile(steps: tuple[int, int] = (10, 15), out: str = "profile") -> Transform:
    """Trace training steps ``steps[0]`` to ``steps[1]`` with torch_xla's profiler into ``out``."""
    steps = tuple(steps) if isinstance(steps, list) else steps
    if (
        not isinstance(steps, tuple)
        or len(steps) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
        or not 1 <= steps[0] <= steps[1]
    ):
        raise ValueError(
            f"profile: steps must be (start, stop) with 1 <= start <= stop, e.g. (10, 15); got {steps!r}"
        )
    if steps[0] < 2:
        raise ValueError(
            f"profile: steps {steps} start at step 1, which compiles the step's graph: the trace would "
            "show compilation, not training. Start after warm-up, e.g. steps=(10, 15)."
        )
    if not isinstance(out, str) or not out:
        raise ValueError(f"profile: out must be a folder path (str), got {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"profile: out={out!r} is a file; it must be a folder to write the trace into")
    return practice("profile", ProfileWindow(steps, out), needs=("with_device",))


claims.declare(
    Claim(
        "profile",
        lambda: profile((2, 4), "profile"),
        summary="a device trace of a window of steps",
    )
)
