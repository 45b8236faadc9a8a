"""clip_grad_norm: scale the gradients down when their norm exceeds ``max_norm``.

``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters, at the one
point where the gradients are final: reduced across replicas and, with fp16,
unscaled, just before the optimizer steps (with accumulation, once per
update). Nothing is read on the host: the norm before clipping stays a device
tensor, in ``run.values["grad_norm"]`` after each update, for logging
(``log_every`` reads it without a sync).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from attrs import frozen

from xlapipe.hooks import Hook
from xlapipe.transform import Transform, register, unchanged

if TYPE_CHECKING:
    from xlapipe.run import Run


@frozen
class ClipGradNorm(Hook):
    """The hook: clip on the final gradients of every update."""

    max_norm: float
    norm_type: float

    def start(self, run: Run) -> Hook:
        return _Clipping(self, run)

    def describe(self) -> dict:
        return {"hook": "clip_grad_norm", "max_norm": self.max_norm, "norm_type": self.norm_type}


class _Clipping(Hook):
    def __init__(self, spec: ClipGradNorm, run: Run) -> None:
        self.spec, self.run = spec, run
        assert run.optimizer is not None, "clip_grad_norm needs an optimizer"
        self.params = [p for g in run.optimizer.param_groups for p in g["params"]]

    def on_gradients(self) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.spec.max_norm, self.spec.norm_type)
        self.run.values["grad_norm"] = norm.detach()


def _number(value: object, what: str, allow_inf: bool = False) -> float:
    if value == "inf" and allow_inf:
        return math.inf
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or (math.isinf(value) and not allow_inf)
        or math.isnan(value)
    ):
        extra = ", or 'inf' for the largest absolute value" if allow_inf else ""
        raise ValueError(f"clip_grad_norm: {what} must be a positive finite number{extra}; got {value!r}")
    return float(value)


@register
def clip_grad_norm(max_norm: float = 1.0, norm_type: float | str = 2.0) -> Transform:
    """Clip the gradients' ``norm_type``-norm (2: Euclidean; ``"inf"``: max) to ``max_norm``."""
    limit = _number(max_norm, "max_norm")
    kind = _number(norm_type, "norm_type", allow_inf=True)
    return Transform(
        "clip_grad_norm",
        unchanged,
        {"max_norm": limit, "norm_type": "inf" if math.isinf(kind) else kind},
        hooks=(ClipGradNorm(limit, kind),),
    )
