"""What the ported scripts share: their results, an average of weights kept by hand, the practices' options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import xlapipe as xp


@dataclass
class Result:
    """What one run of a script gives back."""

    losses: list[float]  # every training step's (micro-batch's) loss, unscaled, in order
    weights: dict[str, torch.Tensor]  # the final weights, on the CPU
    average: dict[str, torch.Tensor] | None = None  # ema's average (eager: kept by hand)
    evals: list[float] = field(default_factory=list)  # the numbers the script's evaluation prints
    saves: list[int] = field(default_factory=list)  # the script's own counter at each checkpoint it wrote
    logged: list[dict[str, Any]] = field(default_factory=list)  # what its logging received
    norms: list[float] = field(default_factory=list)  # eager: the gradient norm before each clipping


class Average:
    """The eager counterpart of ``xp.ema(decay)``: ``a = decay * a + (1 - decay) * w`` after each
    update, for every floating-point parameter and buffer (other buffers copied), from the initial weights.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.average = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def update(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for key, weight in model.state_dict().items():
                if self.average[key].is_floating_point():
                    self.average[key].mul_(self.decay).add_(weight.detach(), alpha=1.0 - self.decay)
                else:
                    self.average[key].copy_(weight)


def option(pipeline: xp.Pipeline, name: str, key: str, default: Any = None) -> Any:
    """The parameter ``key`` of the practice ``name`` in ``pipeline`` (``default`` when it is absent)."""
    for transform in pipeline.transforms:
        if transform.name == name:
            return dict(transform.params)[key]
    return default


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
