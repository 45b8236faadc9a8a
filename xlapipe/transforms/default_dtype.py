"""set_default_tensor_type: the float32 default from the original TPU work.

``torch.set_default_tensor_type`` is deprecated since torch 2.1; this records
``torch.set_default_dtype`` (and optionally ``torch.set_default_device``) as
effects that :func:`xlapipe.session` applies and restores on exit.
"""

from __future__ import annotations

from attrs import field, frozen

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.effects import DTYPES, DefaultDevice, DefaultDtype
from xlapipe.transform import Transform, practice, register


@frozen
class DefaultTensorType:
    """The practice's parameters."""

    dtype: str = field(default="float32", validator=checks.one_of("set_default_tensor_type", "dtype", DTYPES))
    device: str | None = field(
        default=None, validator=checks.one_of("set_default_tensor_type", "device", (None, "cpu", "xla"))
    )


@register
def set_default_tensor_type(dtype: str = "float32", device: str | None = None) -> Transform:
    """Make ``dtype`` (and ``device``: ``"cpu"`` or ``"xla"``) the process default while training."""
    spec = DefaultTensorType(dtype, device)
    effects = [DefaultDtype(dtype)] + ([DefaultDevice(device)] if device else [])
    return practice(
        "set_default_tensor_type",
        spec,
        needs=("with_device",) if device == "xla" else (),
        effects=effects,
    )


claims.declare(
    Claim(
        "set_default_tensor_type",
        set_default_tensor_type,
        summary="the default dtype (and device) set for the session, restored after",
    )
)
