"""The precision policy: which float type, and how it is applied."""

from __future__ import annotations

import contextlib

import torch
from attrs import field, frozen

NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("autocast", "downcast", "env")


def _check_name(_: object, __: object, value: str) -> None:
    if value not in NAMES:
        raise ValueError(f"unknown precision {value!r}; choose one of {', '.join(NAMES)}")


def _check_mode(_: object, __: object, value: str) -> None:
    if value not in MODES:
        raise ValueError(f"unknown precision mode {value!r}; choose one of {', '.join(MODES)}")


@frozen
class Precision:
    """``name`` is fp32, bf16 or fp16; ``mode`` is how a lower precision is reached.

    - ``autocast``: ``torch.autocast`` around forward and loss; weights stay fp32.
    - ``downcast``: the model's floating-point weights are converted.
    - ``env``: the legacy ``XLA_USE_BF16=1`` route (XLA only, bf16 only).
    """

    name: str = field(default="fp32", validator=_check_name)
    mode: str = field(default="autocast", validator=_check_mode)

    def __attrs_post_init__(self) -> None:
        if self.name == "fp16" and self.mode == "downcast":
            raise ValueError(
                "fp16 downcast cannot train: the gradient scaler fp16 needs refuses "
                "fp16 gradients. Use with_precision('fp16', mode='autocast'), "
                "or downcast to bf16."
            )
        if self.name == "fp16" and self.mode == "env":
            raise ValueError(
                "fp16 has no environment route in torch_xla 2.9 (XLA_USE_FP16 is "
                "ignored). Use with_precision('fp16', mode='autocast')."
            )

    @property
    def dtype(self) -> torch.dtype:
        return NAMES[self.name]

    @property
    def uses_scaler(self) -> bool:
        return self.name == "fp16"

    @property
    def weight_dtype(self) -> torch.dtype | None:
        """The dtype the model's weights are converted to, if any."""
        return self.dtype if self.mode == "downcast" and self.name != "fp32" else None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[object]:
        """The context forward and loss run under on ``device``."""
        if self.name == "fp32" or self.mode != "autocast":
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)
