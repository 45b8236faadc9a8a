"""with_matmul_precision: how many bf16 passes a TPU spends on each fp32 matrix multiplication.

A TPU's matrix units multiply bf16 numbers. For fp32 inputs torch_xla asks XLA
for one of three precisions (``torch_xla.backends.set_mat_mul_precision``):

- ``default``: one bf16 pass (inputs rounded to bf16, about 8 significant bits,
  fp32 accumulation): fastest, and what torch_xla 2.9 starts with, so an
  "fp32" model on a TPU multiplies in bf16 unless told otherwise;
- ``high``: three passes (bf16_3x, about 14-16 bits);
- ``highest``: six passes (about fp32's 22-24 bits): slowest, closest to what
  fp32 means on a CPU or GPU.

It changes convolutions too, and only fp32 inputs: matmuls that autocast or a
downcast already run in bf16 are unaffected. The level is process-wide; the
session sets it and puts the previous one back on exit.

Two things found with torch_xla 2.9 decide how it is applied:

- the CPU runtime ignores it: results are bitwise the same under every level
  (fp32 arithmetic; the level does reach the HLO as ``operand_precision``), so
  there this transform warns and does nothing;
- torch_xla's graph cache does not tell levels apart: the same graph hashes the
  same under every level and a graph compiled before the change is reused at
  its old precision (measured: ``CachedCompile`` after switching). So a level
  other than the current one is refused once the process has compiled any
  graph; set it in the first session of a process.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator

from attrs import field, frozen

from xlapipe import checks, claims, runtime
from xlapipe.claims import Claim
from xlapipe.transform import Transform, practice, register

LEVELS = ("default", "high", "highest")
BF16_PASSES = {"default": 1, "high": 3, "highest": 6}  # on a TPU's matrix units
UNSUPPORTED = ("CPU",)


class MatmulPrecisionWarning(RuntimeWarning):
    """The runtime ignores the matmul precision; the setting is left alone."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch_xla logs 'setting it more than once is not recommended' on every set; the check here is stricter."""
    logger = logging.getLogger("torch_xla.backends")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def switch(level: str) -> Callable[[], None]:
    """Set the matmul precision to ``level`` for fp32 inputs; return what puts the previous one back.

    Refused when it would change the level after this process compiled a graph.
    """
    import torch_xla
    import torch_xla.backends as backends

    current = backends.get_mat_mul_precision()
    if current == level:
        return lambda: None
    compiled = torch_xla._XLAC._xla_get_num_cached_compilation_graph()
    if compiled:
        raise RuntimeError(
            f"with_matmul_precision({level!r}): this process has already compiled {compiled} XLA graph(s) "
            f"at precision {current!r}, and torch_xla 2.9's graph cache does not tell precisions apart "
            f"(a graph hashes the same under every level), so graphs compiled before would keep running at "
            f"{current!r}. Choose the precision before anything is compiled: make this the process's first "
            "session on the device, or run in a fresh process."
        )
    with _quiet():
        backends.set_mat_mul_precision(level)

    def restore() -> None:
        with _quiet():
            backends.set_mat_mul_precision(current)

    return restore


@frozen
class MatmulPrecision:
    """The effect: ``set_mat_mul_precision(level)`` for the session (a warning on the CPU runtime)."""

    level: str = field(
        validator=checks.one_of(
            "with_matmul_precision", "level", LEVELS, " (1, 3 or 6 bf16 passes per fp32 matmul on a TPU)"
        )
    )
    before_runtime: bool = field(default=False, init=False)

    def apply(self) -> Callable[[], None]:
        kind = runtime.kind()
        if kind in UNSUPPORTED:
            warnings.warn(
                f"with_matmul_precision({self.level!r}): the {kind} runtime computes fp32 matmuls in fp32 "
                "whatever the level (results are bitwise the same under default, high and highest), so the "
                "setting is left alone. On a TPU it picks 1, 3 or 6 bf16 passes per fp32 matmul.",
                MatmulPrecisionWarning,
                stacklevel=2,
            )
            return lambda: None
        return switch(self.level)

    def describe(self) -> dict:
        return {"effect": "matmul_precision", "level": self.level}


@register
def with_matmul_precision(level: str = "highest") -> Transform:
    """Multiply fp32 matrices at ``level`` on a TPU: ``default`` (1 bf16 pass), ``high`` (3), ``highest`` (6)."""
    spec = MatmulPrecision(level)
    return practice("with_matmul_precision", spec, needs=("with_device",), effects=(spec,))


claims.declare(
    Claim(
        "with_matmul_precision",
        with_matmul_precision,
        summary="XLA's matmul precision for the process",
        own_process=True,
    )
)
