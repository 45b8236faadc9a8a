"""ema_weights: an exponential moving average of the weights, updated after every optimizer update."""

from __future__ import annotations

import torch
from attrs import frozen

import xlapipe as xp


@frozen
class EmaWeights(xp.Hook):
    """What the transform records on the setup: a plain value, the same for every run."""

    decay: float

    def start(self, run: xp.Run) -> xp.Hook:
        return _Averaging(self.decay, run)  # per-run state lives in the object start returns


class _Averaging(xp.Hook):
    def __init__(self, decay: float, run: xp.Run) -> None:
        self.decay, self.run = decay, run
        self.average = [p.detach().clone() for p in run.model.parameters()]  # on the device

    def wrap_update(self, update):
        def update_then_average() -> bool:
            updated = update()
            if updated:  # with accumulate_grad, only every k-th micro-batch updates
                with torch.no_grad():
                    for a, p in zip(self.average, self.run.model.parameters()):
                        a.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
            return updated

        return update_then_average


def averaged_weights(run: xp.Run) -> list[torch.Tensor]:
    """The run's averaged weights (in ``run.model.parameters()`` order)."""
    part = run.hook(_Averaging)
    if part is None:
        raise ValueError("this run has no ema_weights in its pipeline")
    return part.average


@xp.register
def ema_weights(decay: float = 0.999) -> xp.Transform:
    """Keep an exponential moving average of the weights, on the device."""
    if not isinstance(decay, float) or not 0.0 < decay < 1.0:
        raise ValueError(f"ema_weights: decay must be a float between 0 and 1, got {decay!r}")
    return xp.Transform("ema_weights", params={"decay": decay}, hooks=(EmaWeights(decay),))
