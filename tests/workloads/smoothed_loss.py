"""smoothed_loss: an exponential moving average of the training loss, on the device, for logging."""

from __future__ import annotations

from typing import Any

import torch
from attrs import field, frozen

import xlapipe as xp
from xlapipe import checks


@frozen
class SmoothedLoss(xp.Hook):
    """The parameters (one vocabulary: validated, described, rebuilt from them) and the hook."""

    decay: float = field(validator=checks.number_in("smoothed_loss", "decay", 0.0, 1.0))

    def start(self, run: xp.hooks.Context) -> xp.Hook:
        return _Smoothing(self.decay, run)  # per-run state lives in the object start returns


class _Smoothing(xp.Hook):
    def __init__(self, decay: float, run: xp.hooks.Context) -> None:
        self.decay, self.run = decay, run
        self.average = torch.zeros((), device=run.device)  # on the device: no host read
        self.seen = torch.zeros((), device=run.device)

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        self.average.mul_(self.decay).add_(loss.float(), alpha=1 - self.decay)
        self.seen.mul_(self.decay).add_(1 - self.decay)
        self.run.values["smoothed_loss"] = self.average / self.seen  # log_every reads it, unbiased

    def state_dict(self) -> dict[str, Any]:  # what a checkpoint carries, so a resume is exact
        return {"average": self.average, "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.copy_(state["average"])
        self.seen.copy_(state["seen"])


def smoothed(run: xp.Run) -> torch.Tensor:
    """The run's smoothed loss (a device tensor: reading it waits for the device)."""
    part = run.hook(_Smoothing)
    if part is None:
        raise ValueError("this run has no smoothed_loss in its pipeline")
    return part.average / part.seen


@xp.register
def smoothed_loss(decay: float = 0.98) -> xp.Transform:
    """Keep an exponential moving average of the training loss in run.values["smoothed_loss"]."""
    return xp.practice("smoothed_loss", SmoothedLoss(decay))
