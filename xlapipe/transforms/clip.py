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

import torch
from attrs import field, frozen

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.transform import Transform, practice, register


def _plain_norm(value: object) -> float | str:
    """An infinite norm type as ``"inf"`` (so the parameters stay JSON), finite ones as floats."""
    if value == "inf" or (_real(value) and math.isinf(value)):  # type: ignore[arg-type]
        return "inf"
    return float(value) if _real(value) else value  # type: ignore[arg-type,return-value]  # checked next


def _check_max_norm(_: object, __: object, value: object) -> None:
    _number(value, "max_norm")


def _check_norm_type(_: object, __: object, value: object) -> None:
    if value != "inf":
        _number(value, "norm_type", allow_inf=True)


@frozen
class ClipGradNorm(Hook):
    """The practice's parameters and its hook: clip on the final gradients of every update."""

    max_norm: float = field(validator=_check_max_norm)  # type: ignore[assignment]  # any value: checked
    norm_type: float | str = field(default=2.0, converter=_plain_norm, validator=_check_norm_type)

    def start(self, run: Context) -> Hook:
        return _Clipping(self, run)


class _Clipping(Hook):
    def __init__(self, spec: ClipGradNorm, run: Context) -> None:
        self.spec, self.run = spec, run
        assert run.optimizer is not None, "clip_grad_norm needs an optimizer"
        self.params = [p for g in run.optimizer.param_groups for p in g["params"]]

    def on_gradients(self) -> None:
        kind = math.inf if self.spec.norm_type == "inf" else float(self.spec.norm_type)
        norm = torch.nn.utils.clip_grad_norm_(self.params, float(self.spec.max_norm), kind)
        self.run.values["grad_norm"] = norm.detach()


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: object, what: str, allow_inf: bool = False) -> None:
    if (
        not _real(value)
        or not value > 0  # type: ignore[operator]
        or (math.isinf(value) and not allow_inf)  # type: ignore[arg-type]
        or math.isnan(value)  # type: ignore[arg-type]
    ):
        extra = ", or 'inf' for the largest absolute value" if allow_inf else ""
        raise ValueError(f"clip_grad_norm: {what} must be a positive finite number{extra}; got {value!r}")


@register
def clip_grad_norm(max_norm: float = 1.0, norm_type: float | str = 2.0) -> Transform:
    """Clip the gradients' ``norm_type``-norm (2: Euclidean; ``"inf"``: max) to ``max_norm``."""
    if _real(max_norm):
        max_norm = float(max_norm)
    return practice("clip_grad_norm", ClipGradNorm(max_norm, norm_type))


claims.declare(
    Claim(
        "clip_grad_norm",
        lambda: clip_grad_norm(0.05),
        summary="each update's final gradients clipped to a norm",
        reference=lambda t: claims.Reference(
            clip=(float(dict(t.params)["max_norm"]), float(dict(t.params)["norm_type"]))
        ),
    )
)
