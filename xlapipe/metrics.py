"""Compile, execute and transfer figures from torch_xla, and a warm-up-aware meter."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Mapping
from typing import Any

from attrs import define, field


def counter(name: str) -> float:
    """torch_xla's counter ``name`` in this process (0 before its first count)."""
    import torch_xla.debug.metrics as met

    return float(met.counter_value(name) or 0)


def samples(name: str) -> float:
    """How many times torch_xla's timed metric ``name`` was recorded (e.g. XLA executions)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return float(data[0]) if data else 0.0


def total_s(name: str) -> float:
    """The seconds recorded under torch_xla's timed metric ``name`` (0 before use)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return data[1] / 1e9 if data else 0.0


def xla_figures() -> dict[str, float]:
    """torch_xla's cumulative counters and timings in this process (zeros before use)."""
    return {
        "compiles": counter("UncachedCompile"),
        "cached_compiles": counter("CachedCompile"),
        "mark_steps": counter("MarkStep"),
        "compile_s": total_s("CompileTime"),
        "execute_s": total_s("ExecuteTime"),
        "transfer_to_device_s": total_s("TransferToDeviceTime"),
    }


def json_safe(value: Any) -> Any:
    """A report made strict-JSON-safe: NaN and infinities become None, tuples lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def wait_for_device(on_xla: bool) -> None:
    """Block until queued XLA work has finished (so wall time is honest)."""
    if on_xla:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()


@define
class Meter:
    """Counts steps and updates; figures cover the steps after the warm-up (and the whole run).

    >>> meter = Meter(warmup=3, on_xla=True)
    >>> for batch in loader: run.step(batch, loss_fn); meter.tick(run.updated)
    >>> meter.report()

    The warm-up is the first ``warmup`` updates (with ``accumulate_grad(k)``,
    ``k * warmup`` steps), so the update's own graph is compiled inside it.
    With a warm-up of two updates or more, the report also has
    ``first_update_s``: from the meter's creation to the first update finished
    on the device, compilation included (its graph is cut and waited for,
    inside the warm-up, so no timed figure changes).
    """

    warmup: int = 0
    on_xla: bool = True
    steps: int = 0
    updates: int = 0
    _start: dict[str, Any] | None = field(default=None, init=False)
    _origin: dict[str, Any] = field(factory=dict, init=False)
    _first_update_s: float | None = field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._origin = self._snapshot()
        if self.warmup == 0:
            self._start = self._origin

    def _snapshot(self) -> dict[str, Any]:
        figures = xla_figures() if self.on_xla else {}
        return {"time": time.perf_counter(), "steps": self.steps, **figures}

    @property
    def warm(self) -> bool:
        """Whether the warm-up is over."""
        return self._start is not None

    def tick(self, updated: bool = True) -> None:
        """Call once after each training step; ``updated``: whether it updated (``run.updated``)."""
        self.steps += 1
        self.updates += int(updated)
        if not updated:
            return
        if self.updates == self.warmup:
            wait_for_device(self.on_xla)
            self._start = self._snapshot()
        if self.updates == 1 and self.warmup >= 2:  # inside the warm-up: finishing it costs no figure
            if self.on_xla:
                import torch_xla

                torch_xla.sync()  # the step's graph may still be pending (the device loader cuts it later)
            wait_for_device(self.on_xla)
            self._first_update_s = self.elapsed_s

    @property
    def elapsed_s(self) -> float:
        """Seconds since the meter was created (e.g. to time a metric: ``[meter.elapsed_s, accuracy]``)."""
        origin: float = self._origin["time"]
        return time.perf_counter() - origin

    def report(self) -> dict[str, float]:
        """Figures after warm-up (``*_after_warmup``, rates) and for the whole run."""
        wait_for_device(self.on_xla)
        end = self._snapshot()
        out: dict[str, float] = {"steps": float(self.steps), "peak_rss_mb": peak_rss_mb()}
        out["total_s"] = end["time"] - self._origin["time"]
        if self._first_update_s is not None:
            out["first_update_s"] = self._first_update_s
        if self.on_xla:
            out["compiles_total"] = end["compiles"] - self._origin["compiles"]
            out["compile_s_total"] = end["compile_s"] - self._origin["compile_s"]
        start = self._start
        if start is None:  # never got past warm-up
            return out
        wall = end["time"] - start["time"]
        measured = end["steps"] - start["steps"]
        out["measured_steps"] = float(measured)
        out["wall_s"] = wall
        out["steps_per_s"] = measured / wall if wall > 0 else float("nan")
        if self.on_xla:
            for key in ("compiles", "compile_s", "execute_s", "transfer_to_device_s", "mark_steps"):
                out[f"{key}_after_warmup"] = end[key] - start[key]
            execute = out["execute_s_after_warmup"]
            out["wall_over_execute"] = wall / execute if execute > 0 else float("nan")
        return out
