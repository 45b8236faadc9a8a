"""ema: an exponential moving average of the weights, on the device, after every optimizer update.

After each update (every one: with ``accumulate_grad``, each k-th micro-batch,
and the end of an epoch's partial window), every floating-point parameter and
buffer ``w`` of the run's model moves its average ``a`` to
``a = decay * a + (1 - decay) * w``; other buffers (counters) are copied.
The update is traced with the step (no host read, no extra execution). The
average starts from the weights the run starts with, as timm's ``ModelEmaV2``
and Composer's ``EMA`` do, and it is part of every checkpoint: a resumed run
continues it exactly.

Use it:

- ``xlapipe.averaged_weights(run)``: the average as a CPU state dict keyed like
  ``run.state_dict()`` (the user's dtypes, tied weights tied);
  ``run.copy_weights_to(model, weights=xlapipe.averaged_weights(run))`` puts it
  into a model;
- ``with xlapipe.using_averaged_weights(run): ...``: the run's model holds the
  average inside the block (evaluate it there), its own weights again after.
  A checkpoint saved (or restored) inside the block holds (or puts back) the
  model and the average each in its place; a training step or an end of epoch
  inside it is refused (it would train the average), as is a second block
  inside the first.

When the session ends, normally or not (an error, Ctrl-C), the average is
kept on the CPU, as the run keeps its weights: ``averaged_weights(run)``
works after the session too.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from attrs import field, frozen

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.run import host_copy
from xlapipe.transform import Transform, practice, register


@frozen
class Ema(Hook):
    """The practice's parameters and its hook."""

    decay: float = field(validator=checks.number_in("ema", "decay", 0.0, 1.0, " (e.g. 0.999)"))

    def start(self, run: Context) -> Hook:
        return _Averaging(float(self.decay), run)


class _Averaging(Hook):
    def __init__(self, decay: float, run: Context) -> None:
        self.decay, self.run = decay, run
        self.live = _distinct(run.model)  # key -> the model's tensor (one key per tensor)
        self.average = {key: t.detach().clone() for key, t in self.live.items()}
        self.lent = False  # the model holds the average (inside using_averaged_weights)

    def follow(self) -> None:
        """Follow the buffers the model replaced (``self.h = new``, not written in place) since the last look."""
        for key, buffer in self.run.model.named_buffers():
            old = self.live.get(key)
            if old is None or old is buffer:
                continue
            if buffer.shape != old.shape or buffer.dtype != old.dtype:
                raise ValueError(
                    f"ema: the model replaced its buffer {key!r} ({tuple(old.shape)} {old.dtype}) with one of "
                    f"another shape or dtype ({tuple(buffer.shape)} {buffer.dtype}), which has no average to "
                    "continue; keep its shape, or keep that state out of the module's buffers"
                )
            self.live[key] = buffer

    def swap(self) -> None:
        """Exchange the model's weights and the average (their data; the tensors stay the model's)."""
        self.follow()
        with torch.no_grad():
            for key, tensor in self.live.items():
                tensor.data, self.average[key].data = self.average[key].data, tensor.data
        self.lent = not self.lent

    def before_train(self) -> None:
        if self.lent:
            raise ValueError(
                "a training step (or run.end_epoch) inside `with xlapipe.using_averaged_weights(run):`: "
                "the model holds the average there, so it would train the average. Nothing was changed; "
                "evaluate inside the block and train after it"
            )

    def after_update(self) -> None:
        self.follow()
        with torch.no_grad():
            for key, weight in self.live.items():
                average = self.average[key]
                if average.is_floating_point():
                    average.mul_(self.decay).add_(weight.detach(), alpha=1.0 - self.decay)
                else:
                    average.copy_(weight)

    @contextlib.contextmanager
    def checkpointing(self) -> Iterator[None]:
        lent = self.lent
        if lent:
            self.swap()  # the model's own weights in the model, the average in the average
        try:
            yield
        finally:
            if lent:
                self.swap()

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "average": dict(self.average)}

    def state_mismatch(self, state: Mapping[str, Any]) -> str | None:
        saved = state.get("average")
        if not isinstance(saved, Mapping) or set(saved) != set(self.average):
            keys = sorted(saved)[:5] if isinstance(saved, Mapping) else saved
            return f"ema: the checkpoint averages {keys}..., not this model's weights"
        shapes = [k for k, v in saved.items() if getattr(v, "shape", None) != self.average[k].shape]
        if shapes:
            return f"ema: the checkpoint's average of {shapes[:5]} has other shapes than this model's"
        if state.get("decay") != self.decay:
            return (
                f"ema: the checkpoint's average was kept with decay {state.get('decay')}, this run's is "
                f"{self.decay}; restore it with xlapipe.ema({state.get('decay')})"
            )
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        problem = self.state_mismatch(state)
        if problem is not None:
            raise ValueError(problem)
        with torch.no_grad():
            for key, value in state["average"].items():
                self.average[key].copy_(value.to(self.average[key].device))

    def close(self) -> None:
        """Keep the average on the CPU (as the run keeps its weights), unless the run's step broke."""
        broken = getattr(getattr(self.run, "_stepper", None), "broken", None)
        if broken is not None:
            _KEPT[self.run] = f"the session failed with the device state broken ({broken})"
            return
        try:
            _KEPT[self.run] = _averaged(self, self.run)
        except Exception as reason:  # noqa: BLE001 - the device may be what failed
            _KEPT[self.run] = f"copying it from the device failed ({type(reason).__name__}: {reason})"


# The average each ended run kept (a CPU state dict), or why it could not be kept.
_KEPT: weakref.WeakKeyDictionary[Any, dict[str, torch.Tensor] | str] = weakref.WeakKeyDictionary()


def _distinct(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers, one key per distinct tensor (the first name of a tied one)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            out[key] = value
    return out


def _part(run: Any) -> _Averaging:
    part = run.hook(_Averaging) if callable(getattr(run, "hook", None)) else None
    if not isinstance(part, _Averaging):
        raise ValueError("this run keeps no average of its weights: add xlapipe.ema(decay) to its pipeline")
    return part


def _averaged(part: _Averaging, run: Any) -> dict[str, torch.Tensor]:
    part.follow()
    first_key = {id(t): key for key, t in part.live.items()}
    averages = {
        key: part.average[first_key[id(t)]] for key, t in run.model.state_dict(keep_vars=True).items()
    }
    dtypes = {k: v.dtype for k, v in run.setup.module.state_dict(keep_vars=True).items()}
    return host_copy(averages, dtypes)


def averaged_weights(run: Any) -> dict[str, torch.Tensor]:
    """The run's average of its weights, as CPU tensors keyed like ``run.state_dict()``.

    After the session, the average kept on the CPU when it ended (normally or not).
    """
    if not getattr(run, "open", True):
        try:
            kept = _KEPT.get(run)
        except TypeError:  # not a weak-referable run: asked below
            kept = None
        if isinstance(kept, dict):
            return dict(kept)
        if isinstance(kept, str):
            raise RuntimeError(
                f"this run's average of its weights was not kept when its session ended: {kept}"
            )
    part = _part(run)
    run.check_open()
    return _averaged(part, run)


@contextlib.contextmanager
def using_averaged_weights(run: Any) -> Iterator[None]:
    """Inside the block the run's model holds the average (evaluate it there); its own weights after."""
    part = _part(run)
    run.check_open()
    if part.lent:
        raise ValueError(
            "xlapipe.using_averaged_weights(run) inside another such block: the model already holds "
            "the average; use the outer block"
        )
    part.swap()
    try:
        yield
    finally:
        if part.lent:
            part.swap()


@register
def ema(decay: float = 0.999) -> Transform:
    """Keep an exponential moving average of the weights, on the device, updated after every update."""
    return practice("ema", Ema(decay))


claims.declare(
    Claim(
        "ema",
        lambda: ema(0.9),
        summary="an average of the weights after every update, checkpointed",
        reference=lambda t: claims.Reference(ema=float(dict(t.params)["decay"])),
    )
)
