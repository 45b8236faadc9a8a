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

The report: ``first_update_s``; ``step_s``, the median time between two steps
of the same epoch after the run's warm-up (on XLA the host waits at each step
marker for the step before, so in the steady state the host's pace is the
device's), ``steps_per_s``; ``epoch_s``, ``step_s`` times the steps of an
epoch (``epoch_steps``: the first epoch that ended), a derived figure. The
warm-up is found per run (:func:`steady_state`): the steps up to the last one
that compiled (at least ``warmup`` steps); ``warmup_steps``, ``measured_steps``,
``step_s_rel_se`` (the median's relative standard error, from the spread of
the measured steps) and ``step_times_s`` (each measured step's time) say how
it went, ``recompiles_throughout`` when the compilations never stop. A run too
short to show ``MIN_STEADY`` steps after its warm-up reports no step time but
``too_short``: why, and the steps it would need. ``compiles_total``, ``compiles_after_warmup``, ``compile_s_*`` and
``execute_s_after_warmup`` of the training (up to the last epoch's end),
compile time and count apart from the step time; ``final_loss``; ``steps``,
``updates``, ``peak_rss_mb``. Written as JSON by the process of global ordinal 0.
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
MIN_STEADY = 5  # steps after the warm-up that a run's median needs at the least
LATE = 0.5  # compilations still growing in the last half of the run: they never stop


@frozen
class Steady:
    """Where a run's steady state starts, and the steps measured in it."""

    warmup: int  # steps left out (the first one's time is always left out: nothing before it)
    gaps: tuple[float, ...]  # the measured steps' times
    recompiles_throughout: bool = False
    too_short: str = ""  # why there is no steady state to measure, with the steps it would need


def steady_state(
    stamps: list[float],
    compiles: list[float] | None,
    epoch_starts: list[int],
    least: int,
    origin: float = 0.0,
) -> Steady:
    """The warm-up of one run and its measured steps.

    ``stamps[i]`` is when step ``i`` ended, ``compiles[i]`` the compilations
    counted by then (None off XLA; ``origin`` before the first step). The
    warm-up ends at the last step that compiled, unless compilations go on in
    the last half of the run at least every fourth step (it recompiles
    throughout: that is its steady state, measured after ``least`` steps);
    a few compilations later on (a first evaluation's) are left to the
    median. The warm-up is at least ``least`` steps. The
    first step of each epoch is left out: it follows whatever ran between
    epochs.
    """
    warmup = max(least, 1)
    late = False
    if compiles:
        grew = [i for i in range(len(compiles)) if compiles[i] > (compiles[i - 1] if i else origin)]
        half = LATE * len(compiles)
        later = [i for i in grew if i >= half]
        if len(later) >= max(2, 0.25 * (len(compiles) - half)):
            late = True  # e.g. a new shape every batch: compiling is part of its steady state
        else:  # a few later compilations (a first evaluation, say) are steps the median sets aside
            early = [i for i in grew if i < half]
            if early:
                warmup = max(warmup, early[-1] + 1)
    gaps = tuple(
        stamps[i] - stamps[i - 1] for i in range(max(warmup, 1), len(stamps)) if i not in epoch_starts
    )
    if len(gaps) >= MIN_STEADY:
        return Steady(warmup, gaps, late)
    need = warmup + MIN_STEADY + (len(epoch_starts) - 1)
    why = (
        f"the run trained {len(stamps)} steps and its warm-up took {warmup} (the last compilation, or "
        f"--warmup): the median step needs at least {MIN_STEADY} steps after the warm-up, so a run needs "
        f"about {need} steps or more (give the script more steps, e.g. a larger --max-steps)"
    )
    return Steady(warmup, gaps, late, why)


def median_rel_se(gaps: tuple[float, ...]) -> float | None:
    """The relative standard error of the median of ``gaps`` (normal approximation, from the IQR)."""
    if len(gaps) < 4:
        return None
    q1, med, q3 = statistics.quantiles(gaps, n=4, method="inclusive")
    if med <= 0:
        return None
    sd = (q3 - q1) / 1.349
    return float(1.2533 * sd / med / len(gaps) ** 0.5)


@frozen
class Measure(Hook):
    """What the transform records: where the report goes and the least warm-up (in steps)."""

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
        self.trained: dict[str, float] | None = None  # the counters at the last epoch's end
        self.stamps: list[float] = []
        self.compiles: list[float] = []  # compilations counted by the end of each step (XLA)
        self.counters: dict[
            int, dict[str, float]
        ] = {}  # step -> the counters read there (warm-up candidates)
        self.epoch_starts = [0]  # index into stamps of each epoch's first step
        self.epoch_steps: int | None = None
        self.first_update_s: float | None = None

    def _counters(self) -> dict[str, float]:
        return xla_figures() if self.on_xla else {}

    def _compiled(self) -> float:
        """The compilations so far (torch_xla counts a CachedCompile at every step that reuses a graph)."""
        from xlapipe.metrics import counter

        return counter("UncachedCompile")

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        self.stamps.append(time.perf_counter())
        if self.on_xla:
            self.compiles.append(self._compiled())  # a counter read: no sync, no device read
            if len(self.compiles) == 1 or self.compiles[-1] > self.compiles[-2]:
                self.counters[len(self.stamps)] = self._counters()  # the warm-up may end here
        if len(self.stamps) == self.spec.warmup and len(self.stamps) not in self.counters:
            self.counters[len(self.stamps)] = self._counters()
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
            "step_figure": "median",
        }
        if self.first_update_s is not None:
            out["first_update_s"] = self.first_update_s
        origin = self.origin.get("compiles", 0.0)
        found = steady_state(
            self.stamps, self.compiles if self.on_xla else None, self.epoch_starts, self.spec.warmup, origin
        )
        out["warmup_steps"] = found.warmup
        if found.recompiles_throughout:
            out["recompiles_throughout"] = True
        if found.too_short:
            out["too_short"] = found.too_short
        elif found.gaps:
            step = statistics.median(found.gaps)
            out.update(step_s=step, steps_per_s=1.0 / step if step > 0 else float("nan"))
            out["step_s_mean"] = statistics.fmean(found.gaps)
            out["measured_steps"] = len(found.gaps)
            out["step_times_s"] = [round(g, 6) for g in found.gaps]
            se = median_rel_se(found.gaps)
            if se is not None:
                out["step_s_rel_se"] = se
            if self.epoch_steps is not None:
                out.update(epoch_s=step * self.epoch_steps, epoch_steps=self.epoch_steps)
        if self.on_xla:
            end = self.trained or self._counters()
            out["compiles_total"] = end["compiles"] - self.origin["compiles"]
            out["compile_s_total"] = end["compile_s"] - self.origin["compile_s"]
            at = self.counters.get(found.warmup)
            if at is None and self.counters:  # the warm-up ended where no counter was read: the last before
                at = self.counters[
                    max((k for k in self.counters if k <= found.warmup), default=min(self.counters))
                ]
            if at is not None:
                for key in ("compiles", "compile_s", "execute_s", "transfer_to_device_s"):
                    out[f"{key}_after_warmup"] = end[key] - at[key]
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
