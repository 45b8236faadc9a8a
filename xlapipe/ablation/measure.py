"""The session's own measurement of a run: ``measured(report, warmup)``, a practice like any other.

``xlapipe ablate`` adds it, through the session's harness point
(:mod:`xlapipe.ablation.harness`), to the pipeline of a script it runs
unchanged, so the script needs no timer and no report of its own. It uses
four hook points and reads nothing of the run but ``run.steps``,
``run.updates``, ``run.values["loss"]`` and ``run.device``:

- ``start``: the clock starts; torch_xla's counters are read.
- ``after_step``: a host timestamp per step; no sync and no host read inside
  the step. The first update's loss is read once, by a step closure that
  runs after the step marker: the time to the first update, compilation
  included.
- ``end_epoch``: how many steps the epoch had; the counters are read again and
  the report so far is written (a run killed later keeps it).
- ``close``: the last step's loss, read after a step marker; the report.

The report: ``first_update_s``; ``step_s``, the mean time between two steps of
the same epoch after the first ``warmup`` steps (on XLA the host waits at each
step marker for the step before, so in the steady state the host's pace is
the device's), ``steps_per_s``; ``epoch_s``, ``step_s`` times the steps of an
epoch (``epoch_steps``: the first epoch that ended); ``compiles_total``,
``compiles_after_warmup``, ``compile_s_*`` and ``execute_s_after_warmup`` of the
training (up to the last epoch's end); ``final_loss``; ``steps``, ``updates``,
``peak_rss_mb``. Written as JSON by the process of global ordinal 0.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import torch
from attrs import frozen

from xlapipe.hooks import Context, Hook
from xlapipe.metrics import json_safe, peak_rss_mb, xla_figures
from xlapipe.transform import Transform, practice

NAME = "measured"


@frozen
class Measure(Hook):
    """What the transform records: where the report goes and how many steps are warm-up."""

    report: str
    warmup: int

    def start(self, run: Context) -> Hook:
        return _Measuring(self, run)


class _Measuring(Hook):
    def __init__(self, spec: Measure, run: Context) -> None:
        self.spec, self.run = spec, run
        self.on_xla = run.device.type == "xla"
        self.start_time = time.perf_counter()
        self.origin = self._counters()
        self.at_warmup: dict[str, float] | None = None
        self.trained: dict[str, float] | None = None  # the counters at the last epoch's end
        self.stamps: list[float] = []
        self.epoch_starts = [0]  # index into stamps of each epoch's first step
        self.epoch_steps: int | None = None
        self.first_update_s: float | None = None

    def _counters(self) -> dict[str, float]:
        return xla_figures() if self.on_xla else {}

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        self.stamps.append(time.perf_counter())
        if len(self.stamps) == self.spec.warmup:
            self.at_warmup = self._counters()
        if updated and self.first_update_s is None and self.spec.warmup >= 2:
            self.first_update_s = float("nan")  # asked once; set when the loss is on the host
            if self.on_xla:
                import torch_xla.core.xla_model as xm

                xm.add_step_closure(self._first_update, args=(loss,))
            else:
                self._first_update(loss)

    def _first_update(self, loss: torch.Tensor) -> None:
        float(loss)  # after the step marker: waits for the device to finish the step, runs nothing
        self.first_update_s = time.perf_counter() - self.start_time

    def end_epoch(self) -> None:
        if len(self.stamps) == self.epoch_starts[-1]:
            return  # no step since the last epoch's end
        if self.epoch_steps is None:
            self.epoch_steps = len(self.stamps) - self.epoch_starts[-1]
        self.epoch_starts.append(len(self.stamps))
        self.trained = self._counters()
        self._write(partial=True)

    def close(self) -> None:
        final_loss = float("nan")
        try:
            if self.on_xla:
                import torch_xla

                torch_xla.sync()  # the last step's graph is cut (and step closures run) before the read
            if "loss" in self.run.values:
                final_loss = float(self.run.values["loss"])
        except Exception:  # noqa: BLE001 - a failed run: its own error is the one to see
            pass
        self._write(partial=False, final_loss=final_loss)

    def report(self) -> dict[str, Any]:
        """The figures measured so far."""
        out: dict[str, Any] = {
            "steps": self.run.steps,
            "updates": self.run.updates,
            "peak_rss_mb": peak_rss_mb(),
            "measured_by": "session",
        }
        if self.first_update_s is not None:
            out["first_update_s"] = self.first_update_s
        gaps = [
            self.stamps[i] - self.stamps[i - 1]
            for i in range(max(self.spec.warmup, 1), len(self.stamps))
            if i not in self.epoch_starts  # the first step of an epoch follows whatever ran between epochs
        ]
        if gaps:
            step = statistics.fmean(gaps)
            out.update(step_s=step, steps_per_s=1.0 / step if step > 0 else float("nan"))
            out["measured_steps"] = len(gaps)
            if self.epoch_steps is not None:
                out.update(epoch_s=step * self.epoch_steps, epoch_steps=self.epoch_steps)
        if self.on_xla:
            end = self.trained or self._counters()
            out["compiles_total"] = end["compiles"] - self.origin["compiles"]
            out["compile_s_total"] = end["compile_s"] - self.origin["compile_s"]
            if self.at_warmup is not None:
                for key in ("compiles", "compile_s", "execute_s"):
                    out[f"{key}_after_warmup"] = end[key] - self.at_warmup[key]
        return out

    def _write(self, partial: bool, **more: Any) -> None:
        if self.on_xla:
            import torch_xla.runtime as xr

            if xr.global_ordinal() != 0:
                return
        text = json.dumps(json_safe({**self.report(), **more, "partial": partial}), allow_nan=False)
        tmp = f"{self.spec.report}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.spec.report)  # a run killed mid-write leaves the last whole report


def measured(report: str, warmup: int = 5) -> Transform:
    """The practice that measures a run in its session and writes the report to ``report``."""
    return practice(NAME, Measure(report, warmup))
