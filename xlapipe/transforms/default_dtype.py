"""set_default_tensor_type: the float32 default from the original TPU work.

``torch.set_default_tensor_type`` is deprecated since torch 2.1; this records
``torch.set_default_dtype`` (and optionally ``torch.set_default_device``) as
effects that :func:`xlapipe.session` applies and restores on exit.
"""

from __future__ import annotations

from xlapipe.effects import DTYPES, DefaultDevice, DefaultDtype
from xlapipe.transform import Transform, register, unchanged


@register
def set_default_tensor_type(dtype: str = "float32", device: str | None = None) -> Transform:
    """Make ``dtype`` (and ``device``: ``"cpu"`` or ``"xla"``) the process default while training."""
    if dtype not in DTYPES:
        raise ValueError(
            f"set_default_tensor_type: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}"
        )
    if device not in (None, "cpu", "xla"):
        raise ValueError(f"set_default_tensor_type: device must be None, 'cpu' or 'xla', got {device!r}")
    effects = [DefaultDtype(dtype)] + ([DefaultDevice(device)] if device else [])
    return Transform(
        "set_default_tensor_type",
        unchanged,
        {"dtype": dtype, "device": device},
        needs=("with_device",) if device == "xla" else (),
        effects=effects,
    )
