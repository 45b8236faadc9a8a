"""Corrected XLA kernels for torch_xla 2.9 defects that train wrong numbers without a word.

Each is an effect that registers a kernel for the ``XLA`` dispatch key while a
session lasts and removes it when the last session that needs it ends
(sessions may overlap). Registering compiles nothing, so a session's first
graph is still the user's (``with_matmul_precision`` needs that).
tests/test_kernel_fixes.py checks that torch_xla's own kernel still has the
defect: it fails on the release that fixes it, and the correction can go.
(The dropout one, which only the compiled paths reach, lives with
:mod:`xlapipe.transforms.compile_step`.)
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch
from attrs import frozen

_LOCK = threading.Lock()
_installed: dict[str, tuple[torch.library.Library, int]] = {}  # op: its library, the sessions using it


def installed(op: str, kernel: Callable) -> Callable[[], None]:
    """Make ``kernel`` the XLA kernel of ``aten::<op>``; the restore puts torch_xla's back after the last user."""
    with _LOCK:
        library, users = _installed.get(op, (None, 0))
        if library is None:
            library = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*(overrid|Overrid).*", category=UserWarning)
                library.impl(op, kernel, "XLA")
        _installed[op] = (library, users + 1)
    done = threading.Event()

    def restore() -> None:
        if done.is_set():
            return
        done.set()
        with _LOCK:
            library, users = _installed.pop(op)
            if users > 1:
                _installed[op] = (library, users - 1)
            else:
                library._destroy()

    return restore


# The two batch-norm ops with running statistics that reach torch_xla's kernels: the lazy path calls
# native_batch_norm, a graph compiled by dynamo (AOTAutograd) _native_batch_norm_legit.
BATCH_NORM_OPS = ("native_batch_norm", "_native_batch_norm_legit")


def running_var_of_one_batch(op: str = "native_batch_norm") -> float:
    """What the XLA kernel of ``aten::<op>`` in force makes of a running variance, from one batch.

    The batch ``[0, 2]`` at momentum 1: 2.0 is PyTorch's unbiased variance, 1.0
    the biased one torch_xla 2.9 folds in. Compiles a tiny graph.
    """
    import torch_xla

    device = torch_xla.device()
    x = torch.tensor([[0.0], [2.0]], device=device)
    running_var = torch.zeros(1, device=device)
    getattr(torch.ops.aten, op)(x, None, None, torch.zeros_like(running_var), running_var, True, 1.0, 1e-5)
    return float(running_var.cpu())


def torch_xla_batch_norm_is_unbiased(op: str = "native_batch_norm") -> bool:
    """Whether torch_xla's own kernel of ``aten::<op>`` updates the running variance as PyTorch does.

    PyTorch folds the unbiased batch variance (``n / (n - 1)`` times the biased
    one) into ``running_var``; torch_xla 2.9 folds the biased one. Outside a
    session only (inside, the corrected kernel would answer).
    """
    if op in _installed:
        raise RuntimeError(
            f"torch_xla's kernel of aten::{op} is replaced while a session lasts: ask outside one"
        )
    return abs(running_var_of_one_batch(op) - 2.0) < 1e-5


def _batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's own decomposition: the running variance takes the unbiased batch variance.

    Without running statistics in training (layer norm comes this way, as
    batch norm over a reshaped input) torch_xla's own kernel is right, and
    runs. The saved statistics come back in the input's dtype, as torch_xla's
    kernel gives them (its backward kernel refuses mixed precisions).
    """
    if training and running_mean is None and running_var is None:
        kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (
            torch.ops.aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
        )
        return kept
    from torch._decomp.decompositions import native_batch_norm_helper

    out, save_mean, save_invstd, _, _ = native_batch_norm_helper(
        input, weight, bias, running_mean, running_var, training, momentum, eps, False
    )
    return out, save_mean.to(input.dtype), save_invstd.to(input.dtype)


@frozen
class CorrectBatchNorm:
    """The effect: XLA kernels for the batch-norm ops that keep PyTorch's running variance."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [installed(op, _batch_norm) for op in BATCH_NORM_OPS]

        def restore() -> None:
            for undo in reversed(restores):
                undo()

        return restore

    def describe(self) -> dict:
        return {"effect": "correct_batch_norm", "device": "xla"}
