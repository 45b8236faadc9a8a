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
"""

from __future__ import annotations

import contextlib
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

    def after_update(self) -> None:
        with torch.no_grad():
            for key, weight in self.live.items():
                average = self.average[key]
                if average.is_floating_point():
                    average.mul_(self.decay).add_(weight.detach(), alpha=1.0 - self.decay)
                else:
                    average.copy_(weight)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "average": dict(self.average)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state["average"]
        if set(saved) != set(self.average):
            raise ValueError(f"ema: the checkpoint averages {sorted(saved)[:5]}..., not this model's weights")
        if state["decay"] != self.decay:
            raise ValueError(
                f"ema: the checkpoint's average was kept with decay {state['decay']}, this run's is {self.decay}"
            )
        with torch.no_grad():
            for key, value in saved.items():
                self.average[key].copy_(value.to(self.average[key].device))


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


def averaged_weights(run: Any) -> dict[str, torch.Tensor]:
    """The run's average of its weights, as CPU tensors keyed like ``run.state_dict()``."""
    part = _part(run)
    run.check_open()
    first_key = {id(t): key for key, t in part.live.items()}
    averages = {
        key: part.average[first_key[id(t)]] for key, t in run.model.state_dict(keep_vars=True).items()
    }
    dtypes = {k: v.dtype for k, v in run.setup.module.state_dict(keep_vars=True).items()}
    return host_copy(averages, dtypes)


@contextlib.contextmanager
def using_averaged_weights(run: Any) -> Iterator[None]:
    """Inside the block the run's model holds the average (evaluate it there); its own weights after."""
    part = _part(run)
    run.check_open()
    live = part.live
    with torch.no_grad():
        for key, tensor in live.items():
            tensor.data, part.average[key].data = part.average[key].data, tensor.data
    try:
        yield
    finally:
        with torch.no_grad():
            for key, tensor in live.items():
                tensor.data, part.average[key].data = part.average[key].data, tensor.data


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
        known=[
            claims.Known(
                "trains_as_eager",
                "lstm_state",
                "a buffer the model replaces (not writes in place) is averaged from its first tensor",
            )
        ],
    )
)
