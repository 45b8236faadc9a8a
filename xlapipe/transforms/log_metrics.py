"""log_every: the loss, gradient norm and learning rate every N steps, without a sync.

Reading a device tensor (``float(loss)``) makes the host wait for the device
and, between two step markers, runs the graph so far as an extra execution.
Here the values are handed to torch_xla's step closures
(``xm.add_step_closure``), which run right after a step marker has executed
the step: the tensors are already computed and reading them is a copy, not
an execution. A loop that logs every step executes exactly as many graphs as
one that does not log.

The record is a dict: ``step`` (training steps so far), ``updates``, ``lr``
(the first parameter group's), ``loss`` and, with ``clip_grad_norm``,
``grad_norm`` (before clipping), as Python floats. It goes to ``to``:
``"print"`` (one line), ``"progress"`` (a tqdm progress bar), a function, or
``"module:function"``. With the device loader the record of step k arrives
when step k+1's batch is handed out; without it, at step k+1's marker; the
last one when the epoch or the session ends.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from attrs import frozen

from xlapipe.hooks import Hook
from xlapipe.transform import Transform, register, unchanged

if TYPE_CHECKING:
    from xlapipe.run import Run

Sink = Callable[[dict[str, Any]], Any]
SINKS = ("print", "progress")


@frozen
class LogEvery(Hook):
    """The hook: every ``every`` steps, hand the step's values to ``to`` after the step ran."""

    every: int
    to: Any  # "print", "progress", "module:function" or a function

    def start(self, run: Run) -> Hook:
        return _Logging(self.every, resolve(self.to), run)

    def describe(self) -> dict:
        return {
            "hook": "log_every",
            "every": self.every,
            "to": self.to if isinstance(self.to, str) else "function",
        }


class _Logging(Hook):
    def __init__(self, every: int, sink: Sink | str, run: Run) -> None:
        self.every, self.run = every, run
        self.bar = None
        if sink == "progress":
            try:
                from tqdm import tqdm
            except ImportError as error:
                raise ImportError(
                    "log_every(to='progress') draws a tqdm progress bar: pip install tqdm, "
                    "or log to 'print' or a function"
                ) from error

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
        values = dict(run.values)
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
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"log_every: every must be a positive int (steps), got {every!r}")
    sink = _plain_sink(to)
    return Transform("log_every", unchanged, {"every": every, "to": sink}, hooks=(LogEvery(every, sink),))
