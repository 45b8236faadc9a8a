"""log_every: the loss, gradient norm and learning rate every N steps, without a sync.

Reading a device tensor (``float(loss)``) makes the host wait for the device
and, between two step markers, runs the graph so far as an extra execution.
Here the values are handed to torch_xla's step closures
(``xm.add_step_closure``), which run right after a step marker has executed
the step: the tensors are already computed and reading them is a copy, not
an execution. A loop that logs every step executes exactly as many graphs as
one that does not log.

The record is a dict: ``step`` (training steps so far, the step just done
included: with ``every=10`` the records are of steps 10, 20, ...; torch_xla's
examples print before their step counter moves on, so their 0, 10, 20 are
these 1, 11, 21), ``updates``, ``lr``
(the first parameter group's), ``loss`` and, with ``clip_grad_norm``,
``grad_norm`` (before clipping), as Python floats. It goes to ``to``:
``"print"`` (one line), ``"progress"`` (a tqdm progress bar), a function, or
``"module:function"``. With the device loader the record of step k arrives
when step k+1's batch is handed out; without it, at step k+1's marker; the
last one when the epoch or the session ends. It holds every value a practice
put in ``run.values`` during step k, wherever it is listed (on the CPU, with no
XLA device, the record is made at once, with the values set so far).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from attrs import field, frozen

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.transform import Transform, practice, register

Sink = Callable[[dict[str, Any]], Any]
SINKS = ("print", "progress")


@frozen
class LogEvery(Hook):
    """The practice's parameters and its hook: every ``every`` steps, hand the step's values to ``to``."""

    every: int = field(validator=checks.positive_int("log_every", "every", " (steps)"))
    to: Any = "print"  # "print", "progress", "module:function" or a function

    def start(self, run: Context) -> Hook:
        return _Logging(self.every, resolve(self.to), run)


class _Logging(Hook):
    def __init__(self, every: int, sink: Sink | str, run: Context) -> None:
        self.every, self.run = every, run
        self.bar = None
        self.monitor_before = True
        if sink == "progress":
            try:
                from tqdm import tqdm
            except ImportError as error:
                raise ImportError(
                    "log_every(to='progress') draws a tqdm progress bar: pip install tqdm, "
                    "or log to 'print' or a function"
                ) from error

            self.monitor_before = tqdm.monitor is not None
            self.bar = tqdm(unit="step", dynamic_ncols=True, desc="training")
            sink = self._to_bar
        elif sink == "print":
            sink = _print
        self.sink: Sink = sink  # type: ignore[assignment]
        self.on_xla = run.device.type == "xla"

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        run = self.run
        if run.steps % self.every:
            return
        record: dict[str, Any] = {"step": run.steps, "updates": run.updates}
        if run.optimizer is not None:
            record["lr"] = run.optimizer.param_groups[0]["lr"]
        values = run.values  # this step's: what practices put in after this hook still arrives
        if self.on_xla:
            import torch_xla.core.xla_model as xm

            xm.add_step_closure(self._emit, args=(record, values))
        else:
            self._emit(record, values)

    def _emit(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        for key, value in {**record, **values}.items():
            record[key] = float(value) if isinstance(value, torch.Tensor) else value
        self.sink(record)

    def _to_bar(self, record: dict[str, Any]) -> None:
        assert self.bar is not None
        self.bar.update(record["step"] - self.bar.n)
        self.bar.set_postfix(
            {k: f"{v:.4g}" for k, v in record.items() if isinstance(v, float)}, refresh=False
        )

    def close(self) -> None:
        try:
            if self.on_xla:
                import torch_xla

                torch_xla.sync()  # runs the closures still waiting for a step marker
        finally:
            if self.bar is not None:
                self.bar.close()
                _stop_monitor(self.monitor_before)


def _stop_monitor(was_running: bool) -> None:
    """Stop the monitor thread tqdm starts with its first bar, unless it ran before the session."""
    from tqdm import tqdm

    monitor = tqdm.monitor
    if not was_running and monitor is not None and not tqdm._instances:
        monitor.exit()
        tqdm.monitor = None


def _print(record: dict[str, Any]) -> None:
    rest = ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in record.items()
        if k not in ("step", "updates")
    )
    print(f"step {record['step']} (update {record['updates']}): {rest}", flush=True)


def resolve(to: Any) -> Sink | str:
    """The sink ``to`` names: a built-in name, a function, or ``module:function`` imported now."""
    if callable(to) or to in SINKS:
        named: Sink | str = to
        return named
    module, _, name = to.partition(":")
    try:
        fn: Any = importlib.import_module(module)
        for part in name.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"log_every: cannot import {to!r} ({error}); give 'module:function' of an importable module"
        ) from error
    if not callable(fn):
        raise TypeError(f"log_every: {to!r} is a {type(fn).__name__}, not a function")
    sink: Sink = fn
    return sink


def _plain_sink(to: Any) -> Any:
    """``to`` as plain data when it can be: an importable top-level function becomes ``module:function``."""
    if isinstance(to, str):
        if to in SINKS or (":" in to and all(to.partition(":")[::2])):
            return to
        raise ValueError(
            f"log_every: to must be 'print', 'progress', 'module:function' or a function; got {to!r}"
        )
    if not (inspect.isfunction(to) or inspect.ismethod(to) or inspect.isbuiltin(to)):
        raise TypeError(
            f"log_every: to must be 'print', 'progress', 'module:function' or a function; "
            f"got {type(to).__name__}"
        )
    module, qualname = getattr(to, "__module__", None), getattr(to, "__qualname__", "")
    if not inspect.ismethod(to) and module and module != "__main__" and "<" not in qualname:
        return f"{module}:{qualname}"
    return to  # a lambda, local function or method: fine here, but the pipeline cannot be described


@register
def log_every(every: int = 10, to: Any = "print") -> Transform:
    """Log loss, gradient norm and learning rate every ``every`` steps, read without a sync."""
    return practice("log_every", LogEvery(every, _plain_sink(to)))


def discard(record: dict[str, Any]) -> None:
    """A sink that keeps nothing (``log_every(to=discard)``: the reads without the printing)."""


claims.declare(
    Claim(
        "log_every",
        lambda: log_every(2, to=discard),
        summary="loss, grad norm and rate logged without a sync",
    )
)
