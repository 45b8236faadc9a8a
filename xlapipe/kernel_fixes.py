"""Corrected XLA kernels for torch_xla 2.9 defects that train wrong numbers without a word.

Each is an effect that registers a kernel for the ``XLA`` dispatch key (or
``AutogradXLA`` where the fix is in the gradient: batch norm in eval mode, the
composite ops torch_xla overrides without a gradient) while a session lasts
and removes it when the last session that needs it ends (sessions may
overlap): batch norm's running variance, elu's gradient, ``norm`` with
p = inf, ``amax``/``amin`` over every dimension, reductions given an empty
dimension list, ``diagonal`` over dims 0 and 1, nearest and bilinear resizes
and the SVD of a batch under ``with_device``; the ops without a gradient under
``compile_step``. Some wrap torch_xla's own kernel (``installed(...,
wraps_own=True)``) and call it with other arguments, or not at all where it
would be wrong. Registering compiles nothing, so a session's first graph is
still the user's (``with_matmul_precision`` needs that).
tests/test_kernel_fixes.py checks that torch_xla's own kernel still has the
defect: it fails on the release that fixes it, and the correction can go.
(The dropout one, which only the compiled paths reach, lives with
:mod:`xlapipe.transforms.compile_step`.)
"""

from __future__ import annotations

import struct
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from attrs import frozen

_LOCK = threading.Lock()
_installed: dict[str, tuple[torch.library.Library, int]] = {}  # op: its library, the sessions using it


def installed(op: str, kernel: Callable, key: str = "XLA", wraps_own: bool = False) -> Callable[[], None]:
    """Make ``kernel`` the ``key`` kernel of ``aten::<op>``; the restore puts torch_xla's back after the
    last user.

    With ``wraps_own``, ``kernel`` is called once with torch_xla's own kernel (a function of the dispatch
    key set and the arguments) and returns the kernel to install, which takes the key set first.
    """
    name = op if key == "XLA" else f"{op}@{key}"
    with _LOCK:
        library, users = _installed.get(name, (None, 0))
        if library is None:
            if wraps_own:
                own = torch._C._dispatch_get_computed_kernel_for_dispatch_key(
                    f"aten::{op}", getattr(torch._C.DispatchKey, key)
                )
                kernel = kernel(own.call_boxed)
            library = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*(overrid|Overrid).*", category=UserWarning)
                library.impl(op, kernel, key, with_keyset=wraps_own)
        _installed[name] = (library, users + 1)
    done = threading.Event()

    def restore() -> None:
        if done.is_set():
            return
        done.set()
        with _LOCK:
            library, users = _installed.pop(name)
            if users > 1:
                _installed[name] = (library, users - 1)
            else:
                library._destroy()

    return restore


def _outside_sessions(op: str) -> None:
    """Refuse a question about torch_xla's own kernel of ``aten::<op>`` while a session replaces it."""
    if op in _installed:
        raise RuntimeError(
            f"torch_xla's kernel of aten::{op} is replaced while a session lasts: ask outside one"
        )


def undo_all(restores: list[Callable[[], None]]) -> Callable[[], None]:
    """One restore for several :func:`installed` kernels, undone in reverse order."""

    def restore() -> None:
        for undo in reversed(restores):
            undo()

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
    _outside_sessions(op)
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


def _batch_norm_autograd(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::native_batch_norm`` for XLA tensors, above autograd: eval mode as differentiable ops.

    torch_xla 2.9's backward kernel ignores its ``train`` flag and always
    differentiates through the batch's statistics, so a batch norm in eval mode
    inside a training model (a frozen-BN fine-tune) got the wrong input
    gradient. In eval mode the output is ``(x - running_mean) * rsqrt(running_var
    + eps) * weight + bias`` as plain ops, whose autograd is exact; in training
    the op goes on to ``_native_batch_norm_legit``, the same kernels and
    backward as before.
    """
    if running_mean is None or running_var is None:
        kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (
            torch.ops.aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
        )
        return kept
    if training:
        trained: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.ops.aten._native_batch_norm_legit(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
        return trained
    return _eval_batch_norm(input, weight, bias, running_mean, running_var, eps)


def _eval_batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch norm with the running statistics, as differentiable ops (empty saved statistics, as
    PyTorch's CPU kernel gives in eval mode)."""
    shape = [1, -1] + [1] * (input.dim() - 2)
    out = (input - running_mean.view(shape)) * torch.rsqrt(running_var.view(shape) + eps)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out.to(input.dtype), input.new_empty(0), input.new_empty(0)


@frozen
class CorrectBatchNorm:
    """The effect: XLA kernels for the batch-norm ops that keep PyTorch's running variance, and
    PyTorch's gradient in eval mode."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [installed(op, _batch_norm) for op in BATCH_NORM_OPS]
        restores.append(installed("native_batch_norm", _batch_norm_autograd, "AutogradXLA"))
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_batch_norm", "device": "xla"}


# -- elu's gradient (F.elu, F.celu, F.selu, nn.ELU/CELU/SELU) -------------------------------------------
#
# Autograd calls aten::elu_backward with the input (is_result=False); torch_xla 2.9's kernel treats it as
# the output (what the in-place elu_ passes), so where x < 0 the gradient is 1 + x instead of exp(x),
# with no error: measured, F.elu at -2.18 got -1.18 instead of 0.113. (Under dynamo selu has a second
# defect: see DecomposeForAutograd.)


def elu_gradient_at(x: float = -1.0) -> float:
    """The gradient of ``F.elu`` at ``x`` on the XLA device, with the kernel in force (exp(x) is right).

    Compiles a tiny graph.
    """
    import torch_xla

    point = torch.tensor([x], device=torch_xla.device(), requires_grad=True)
    (grad,) = torch.autograd.grad(torch.nn.functional.elu(point).sum(), point)
    return float(grad.cpu())


def torch_xla_elu_gradient_is_right() -> bool:
    """Whether torch_xla's own ``aten::elu_backward`` gives PyTorch's gradient (outside a session only)."""
    _outside_sessions("elu_backward")
    return abs(elu_gradient_at(-1.0) - float(torch.tensor(-1.0).exp())) < 1e-5


def _elu_backward(
    grad_output: torch.Tensor,
    alpha: float,
    scale: float,
    input_scale: float,
    is_result: bool,
    self_or_result: torch.Tensor,
) -> torch.Tensor:
    """PyTorch's formula, for both what autograd passes (the input) and what the in-place elu_ passes
    (the output)."""
    negative_coef, x = alpha * scale, self_or_result
    if is_result:
        negative = grad_output * (input_scale * (x + negative_coef))
    else:  # exp of the negative part only: no inf where the other branch is taken
        negative = grad_output * (input_scale * negative_coef * torch.exp(x.clamp(max=0) * input_scale))
    return torch.where(x <= 0, negative, grad_output * scale)


@frozen
class CorrectEluGradient:
    """The effect: PyTorch's gradient for elu, celu and selu on the XLA device."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        return installed("elu_backward", _elu_backward)

    def describe(self) -> dict:
        return {"effect": "correct_elu_gradient", "device": "xla"}


# -- Tensor.norm and torch.norm with p = inf or -inf -------------------------------------------------------
#
# On an XLA tensor torch.norm (and Tensor.norm) reaches aten::norm, whose torch_xla 2.9 kernel gets p = inf
# and -inf wrong, value and gradient, with no error (measured: 1.0 for a largest magnitude of 2.18).
# torch.linalg.vector_norm, which torch.norm calls on the CPU and CUDA, is right there: aten::norm's XLA
# kernels call it, for every p (p = 2 within 2.4e-7 of torch_xla's own). The gradient stays aten::norm's
# (autograd runs above the kernel).

NORM_OPS = ("norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim_dtype")


def max_norm_of(values: list[float]) -> float:
    """``torch.norm(values, p=inf)`` on the XLA device, with the kernel in force. Compiles a tiny graph."""
    import torch_xla

    return float(torch.tensor(values, device=torch_xla.device()).norm(p=float("inf")).cpu())


def torch_xla_max_norm_is_right() -> bool:
    """Whether torch_xla's own ``aten::norm`` gives the largest magnitude for p = inf (outside a session)."""
    _outside_sessions("norm.Scalar")
    return abs(max_norm_of([0.5, -2.0]) - 2.0) < 1e-6


def _norm(
    self: torch.Tensor,
    p: float | None = 2,
    dim: list[int] | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """aten::norm as torch.linalg.vector_norm (an empty ``dim`` is every dimension, as aten::norm has it)."""
    out: torch.Tensor = torch.linalg.vector_norm(
        self, 2 if p is None else p, dim or None, keepdim, dtype=dtype
    )
    return out


def _norm_dtype(self: torch.Tensor, p: float | None, dtype: torch.dtype) -> torch.Tensor:
    return _norm(self, p, None, False, dtype)


def _norm_dim_dtype(
    self: torch.Tensor, p: float | None, dim: list[int], keepdim: bool, dtype: torch.dtype
) -> torch.Tensor:
    return _norm(self, p, dim, keepdim, dtype)


@frozen
class CorrectNorm:
    """The effect: ``aten::norm``'s XLA kernels as ``torch.linalg.vector_norm`` (p = inf and -inf right)."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        kernels: tuple[Callable[..., torch.Tensor], ...] = (_norm, _norm, _norm_dtype, _norm_dim_dtype)
        restores = [installed(op, kernel) for op, kernel in zip(NORM_OPS, kernels)]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_norm", "device": "xla"}


# -- ops torch_xla overrides with no gradient, under dynamo ------------------------------------------------
#
# torch_xla 2.9 gives these composite ops (PyTorch differentiates them through what they are made of) a
# kernel of its own and no autograd kernel. Traced lazily they still get PyTorch's gradient; in a graph
# dynamo compiles (AOTAutograd, torch.compile(backend="openxla")) they get none, so no parameter before one
# gets a gradient and the optimizer skips them, with a warning at most (measured for each: std(dim=...),
# kl_div, diag, inverse, cross, selu, svd, qr; logdet fails either way). The effect makes each op's
# autograd kernel on XLA PyTorch's own decomposition, as on the CPU. Lazily traced numbers do not change
# (measured, the same ops).

WITHOUT_GRADIENT = (
    "cross",
    "diag",
    "inverse",
    "kl_div",
    "logdet",
    "qr",
    "selu",
    "selu_",
    "std",
    "std.dim",
    "svd",
)


def ops_without_gradient() -> list[str]:
    """The aten ops torch_xla gives an XLA kernel and no autograd kernel over a composite PyTorch
    differentiates (what :data:`WITHOUT_GRADIENT` was taken from; a test holds them equal)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
        and has(name, "XLA")
        and has(name, "CompositeImplicitAutograd")
        and not has(name, "AutogradXLA")
    )


def _decomposed(name: str) -> Callable[..., object]:
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args: object, **kwargs: object) -> object:
        return op.decompose(*args, **kwargs)

    return kernel


@frozen
class DecomposeForAutograd:
    """The effect: PyTorch's gradient, through their decompositions, for the ops torch_xla overrides
    without one (:data:`WITHOUT_GRADIENT`), while a session with ``compile_step`` lasts."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [installed(name, _decomposed(name), "AutogradXLA") for name in WITHOUT_GRADIENT]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "decompose_for_autograd", "device": "xla"}


# -- amax and amin over every dimension ---------------------------------------------------------------------
#
# x.amax() and x.amin() (no dim: every dimension, as PyTorch defines it) return x unreduced on torch_xla
# 2.9, shape included, with no error: x / x.abs().amax(), the usual fp8 or int8 scale, then divides x by
# its own magnitudes. Reductions over given dimensions are right. The corrected kernels reduce every
# dimension when none is given, through one max (min) over the reduced dimensions moved last.

EXTREMA_OPS = ("amax", "amin")


def amax_of(values: list[list[float]]) -> list[float] | float:
    """``x.amax()`` on the XLA device, with the kernel in force (a float when right). Compiles a tiny graph."""
    import torch_xla

    out: list[float] | float = torch.tensor(values, device=torch_xla.device()).amax().cpu().tolist()
    return out


def torch_xla_amax_reduces() -> bool:
    """Whether torch_xla's own ``aten::amax`` reduces every dimension when given none (outside a session)."""
    _outside_sessions("amax")
    return amax_of([[1.0, 3.0], [2.0, 0.0]]) == 3.0


def _extreme(self: torch.Tensor, dim: list[int], keepdim: bool, largest: bool) -> torch.Tensor:
    """amax (``largest``) or amin over ``dim`` (empty: every dimension), as PyTorch defines them."""
    rank = self.dim()
    if rank == 0:
        return self.clone()
    reduced = sorted({d % rank for d in dim}) if dim else list(range(rank))
    kept = [d for d in range(rank) if d not in reduced]
    flat = self.permute(kept + reduced).reshape([self.shape[d] for d in kept] + [-1])
    out = (flat.max(-1) if largest else flat.min(-1)).values
    if keepdim:
        out = out.reshape([1 if d in reduced else self.shape[d] for d in range(rank)])
    return out


def _amax(self: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _extreme(self, list(dim or ()), keepdim, largest=True)


def _amin(self: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False) -> torch.Tensor:
    return _extreme(self, list(dim or ()), keepdim, largest=False)


@frozen
class CorrectExtrema:
    """The effect: ``aten::amax`` and ``aten::amin`` reduce every dimension when given none, on XLA."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [installed("amax", _amax), installed("amin", _amin)]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_extrema", "device": "xla"}


# -- reductions given an empty dimension list ---------------------------------------------------------------
#
# sum, mean, var, std, var_mean, std_mean and linalg.vector_norm given dim=() or dim=[] reduce every
# dimension in PyTorch; torch_xla 2.9 reads the empty list as no reduction and returns x as it is (var and
# std: nan in each element), with no error. Generic code gets one from tuple(range(1, x.dim())) on a 1-D x.
# The corrected kernels give torch_xla's own kernel dim=None, every dimension, which it gets right.

EMPTY_DIM_OPS = {  # op: the position of its dim argument
    "sum.dim_IntList": 1,
    "mean.dim": 1,
    "var.correction": 1,
    "std.correction": 1,
    "std.dim": 1,
    "var_mean.correction": 1,
    "std_mean.correction": 1,
    "linalg_vector_norm": 2,
}


def sum_over_no_dims(values: list[list[float]]) -> list[list[float]] | float:
    """``x.sum(dim=())`` on the XLA device, with the kernel in force (a float when right). Compiles a
    tiny graph."""
    import torch_xla

    out: list[list[float]] | float = (
        torch.tensor(values, device=torch_xla.device()).sum(dim=()).cpu().tolist()
    )
    return out


def torch_xla_reduces_an_empty_dim_list() -> bool:
    """Whether torch_xla's own ``aten::sum`` reduces every dimension when given ``dim=()`` (outside a
    session)."""
    _outside_sessions("sum.dim_IntList")
    return sum_over_no_dims([[1.0, 3.0], [2.0, 0.0]]) == 6.0


def _every_dim_for_none(position: int) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """A kernel over torch_xla's own that passes ``dim=None`` where it was given an empty list."""

    def wrap(own: Callable[..., object]) -> Callable[..., object]:
        def kernel(keyset: object, *args: object, **kwargs: object) -> object:
            dim = args[position] if len(args) > position else None
            if isinstance(dim, (list, tuple)) and not dim:
                args = (*args[:position], None, *args[position + 1 :])
            return own(keyset, *args, **kwargs)

        return kernel

    return wrap


@frozen
class CorrectEmptyDims:
    """The effect: the reductions of :data:`EMPTY_DIM_OPS` reduce every dimension when given an empty
    dimension list, on XLA."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [
            installed(op, _every_dim_for_none(position), wraps_own=True)
            for op, position in EMPTY_DIM_OPS.items()
        ]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_empty_dims", "device": "xla"}


# -- diagonal over dims 0 and 1 ----------------------------------------------------------------------------
#
# torch.diagonal(x) (dims 0 and 1) of a tensor of 3 or more dimensions takes the diagonal of the last two
# on torch_xla 2.9, in a result of the right shape, with no error; writing through that view is wrong too,
# and its gradient fails to lower. Functionalization reaches aten::diagonal_copy and aten::diagonal_scatter;
# every other pair of dims is right, (1, 0) included, and the diagonal at offset k over (0, 1) is the one at
# offset -k over (1, 0), element for element: the corrected kernels ask torch_xla's own for that one.

DIAGONAL_OPS = {"diagonal_copy": 1, "diagonal_scatter": 2}  # op: the position of its offset argument


def diagonal_of(shape: tuple[int, ...]) -> list:
    """``torch.diagonal(x)`` of ``arange`` in ``shape`` on the XLA device, with the kernel in force.
    Compiles a tiny graph."""
    import torch_xla

    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    out: list = torch.diagonal(x.to(torch_xla.device())).cpu().tolist()
    return out


def torch_xla_diagonal_is_right() -> bool:
    """Whether torch_xla's own ``aten::diagonal_copy`` takes dims 0 and 1 of a 3-D tensor (outside a
    session)."""
    _outside_sessions("diagonal_copy")
    shape = (2, 3, 4)
    return diagonal_of(shape) == torch.diagonal(torch.arange(24.0).reshape(shape)).tolist()


def _dims_swapped(position: int) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """A kernel over torch_xla's own that takes the diagonal over dims 0 and 1 as the one over 1 and 0."""

    def wrap(own: Callable[..., object]) -> Callable[..., object]:
        def kernel(keyset: object, *args: Any) -> object:
            offset, dim1, dim2 = (list(args[position:]) + [0, 0, 1][len(args) - position :])[:3]
            rank = args[0].dim()
            if rank >= 3 and (dim1 % rank, dim2 % rank) == (0, 1):
                offset, dim1, dim2 = -offset, 1, 0
            return own(keyset, *args[:position], offset, dim1, dim2)

        return kernel

    return wrap


@frozen
class CorrectDiagonal:
    """The effect: ``diagonal`` over dims 0 and 1 of a tensor of 3 or more dimensions, value, view and
    gradient, as PyTorch's, on XLA."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [
            installed(op, _dims_swapped(position), wraps_own=True) for op, position in DIAGONAL_OPS.items()
        ]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_diagonal", "device": "xla"}


# -- interpolate: nearest and bilinear ---------------------------------------------------------------------
#
# F.interpolate(x, scale_factor=s) in nearest or bilinear mode (align_corners=False) maps output pixel i
# to input position i / s in PyTorch; torch_xla 2.9's kernels get s along with the output size and use
# in / out instead, which differs when in * s is not whole: other pixels, value and gradient, with no
# error (measured: 0.6 and 1.7 on 7 x 9). And off the TPU (which runs a resize of its own, a custom call
# not measured here) torch_xla lowers bilinear resizes with BuildResize, which gets some sizes wrong
# whatever the scale, align_corners or not (on the CPU runtime 7 x 9 to 11 x 15 is off by more than 1 on
# unit-normal pixels: tests/test_kernel_fixes.py). Where torch_xla's own would be wrong, the
# corrected kernels compute PyTorch's source indices and weights on the host (float32, as PyTorch's CPU
# kernel) and gather with them (index_select; the gradients with index_add), exact on every device;
# elsewhere (a whole scale such as 2, a nearest resize by size) torch_xla's own kernel runs.

UPSAMPLE_OPS = {  # op: (its first scale argument's position, bilinear)
    "upsample_nearest2d": (2, False),
    "upsample_nearest2d_backward": (3, False),
    "upsample_bilinear2d": (3, True),
    "upsample_bilinear2d_backward": (4, True),
}


def interpolated(values: list[float], scale: float) -> list[float]:
    """``F.interpolate`` of one row ``values`` by ``(1, scale)``, nearest, on the XLA device with the
    kernel in force. Compiles a tiny graph."""
    import torch_xla

    x = torch.tensor(values, device=torch_xla.device()).view(1, 1, 1, -1)
    out: list[float] = torch.nn.functional.interpolate(x, scale_factor=(1.0, scale)).view(-1).cpu().tolist()
    return out


def torch_xla_interpolates_by_the_scale() -> bool:
    """Whether torch_xla's own ``aten::upsample_nearest2d`` maps pixels by the scale given, as eager
    PyTorch does (outside a session): 7 pixels by 1.7."""
    _outside_sessions("upsample_nearest2d")
    row = [float(i) for i in range(7)]
    want = torch.nn.functional.interpolate(torch.tensor(row).view(1, 1, 1, -1), scale_factor=(1.0, 1.7))
    return interpolated(row, 1.7) == want.view(-1).tolist()


def _f32(value: float) -> float:
    """``value`` rounded to float32 (no tensor: this runs on every resize traced)."""
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


def _step(size: int, out: int, scale: float | None, corners: bool) -> float:
    """PyTorch's input step per output pixel (area_pixel_compute_scale), in float32 (a quotient of two
    whole numbers rounded once from double is float32's own quotient)."""
    if corners:
        return _f32((size - 1) / (out - 1)) if out > 1 else 0.0
    if scale is not None and scale > 0:
        return _f32(1.0 / scale)
    return _f32(size / out)


def _scale_ignored(size: int, out: int, bilinear: bool) -> bool:
    """At the same size PyTorch copies pixel for pixel, and nearest maps by halves at twice the size,
    whatever the scale (measured)."""
    return out == size or (not bilinear and out == 2 * size)


def _own_is_right(size: int, out: int, scale: float | None, bilinear: bool, corners: bool, tpu: bool) -> bool:
    """Whether torch_xla's own kernel resizes this dimension as PyTorch does."""
    if _scale_ignored(size, out, bilinear):
        return True
    if bilinear and not tpu:  # BuildResize
        return False
    return _step(size, out, scale, corners) == _step(size, out, None, corners)


def _nearest_index(size: int, out: int, step: float, device: torch.device) -> torch.Tensor:
    """PyTorch's nearest source of each output pixel: floor(i * step), at most size - 1."""
    at = torch.arange(out, dtype=torch.float32) * torch.tensor(step, dtype=torch.float32)
    return at.floor().long().clamp(max=size - 1).to(device)


def _linear_taps(
    size: int, out: int, step: float, corners: bool, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's two sources of each output pixel and their weights (area_pixel_compute_source_index)."""
    i, step_ = torch.arange(out, dtype=torch.float32), torch.tensor(step, dtype=torch.float32)
    at = i * step_ if corners else ((i + 0.5) * step_ - 0.5).clamp(min=0)
    low = at.long()
    high = low + (low < size - 1).long()
    upper = at - low
    return low.to(device), high.to(device), (1 - upper).to(dtype).to(device), upper.to(dtype).to(device)


def _resample(x: torch.Tensor, dim: int, out: int, step: float, corners: bool | None) -> torch.Tensor:
    """``x`` resized to ``out`` pixels along ``dim``, PyTorch's way (``corners`` None: nearest)."""
    if corners is None:
        return x.index_select(dim, _nearest_index(x.shape[dim], out, step, x.device))
    low, high, w_low, w_high = _linear_taps(x.shape[dim], out, step, corners, x.dtype, x.device)
    shape = [out if d == dim else 1 for d in range(x.dim())]
    return x.index_select(dim, low) * w_low.view(shape) + x.index_select(dim, high) * w_high.view(shape)


def _resample_backward(
    g: torch.Tensor, dim: int, size: int, step: float, corners: bool | None
) -> torch.Tensor:
    """The gradient of :func:`_resample` along ``dim``, back to ``size`` input pixels."""
    zeros = g.new_zeros([size if d == dim else n for d, n in enumerate(g.shape)])
    if corners is None:
        return zeros.index_add(dim, _nearest_index(size, g.shape[dim], step, g.device), g)
    low, high, w_low, w_high = _linear_taps(size, g.shape[dim], step, corners, g.dtype, g.device)
    shape = [g.shape[dim] if d == dim else 1 for d in range(g.dim())]
    return zeros.index_add(dim, low, g * w_low.view(shape)).index_add(dim, high, g * w_high.view(shape))


def _resized_as_pytorch(
    position: int, bilinear: bool, tpu: bool
) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """A kernel over torch_xla's own upsample (``position``: where its scales start) that resizes as
    PyTorch does where torch_xla's own would not."""
    backward = position == (4 if bilinear else 3)

    def wrap(own: Callable[..., object]) -> Callable[..., object]:
        def kernel(keyset: object, *args: Any) -> object:
            corners = bool(args[position - 1]) if bilinear else False
            scales = (list(args[position:]) + [None, None])[:2]
            x, out = args[0], list(args[1])
            size = list(args[2])[2:] if backward else list(x.shape[2:])
            dims = list(zip(size, out, scales))
            if all(_own_is_right(n, o, s, bilinear, corners, tpu) for n, o, s in dims):
                return own(keyset, *args)
            mode = corners if bilinear else None
            steps_h, steps_w = [
                _step(n, o, None if _scale_ignored(n, o, bilinear) else s, corners) for n, o, s in dims
            ]
            if backward:
                return _resample_backward(
                    _resample_backward(x, 3, size[1], steps_w, mode), 2, size[0], steps_h, mode
                )
            return _resample(_resample(x, 2, out[0], steps_h, mode), 3, out[1], steps_w, mode)

        return kernel

    return wrap


@frozen
class CorrectInterpolate:
    """The effect: ``F.interpolate`` in nearest and bilinear mode as PyTorch's, value and gradient, on
    XLA: by a scale that does not give whole sizes, and (off the TPU) bilinear by any size."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        from xlapipe import runtime

        tpu = runtime.kind() == "TPU"
        restores = [
            installed(op, _resized_as_pytorch(position, bilinear, tpu), wraps_own=True)
            for op, (position, bilinear) in UPSAMPLE_OPS.items()
        ]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_interpolate", "device": "xla"}


# -- the SVD of a batch of matrices ---------------------------------------------------------------------------
#
# torch.linalg.svd (and torch.svd, torch.linalg.svdvals, matrix_rank, pinv, which reach aten::_linalg_svd) of
# a batch on torch_xla 2.9 gives Vh as V with its first two dimensions swapped, and S with the shape of one
# matrix's singular values over the whole batch's data: Vh is wrong without a word where the shapes fit,
# and S fails at its first use. The SVD of one matrix is right, so the corrected kernels take the SVD of a
# batch one matrix at a time with torch_xla's own and stack the results (a graph with one SVD per matrix).

SVD_OPS = ("_linalg_svd",)  # torch.svd reaches it too, also in inference mode (measured)


def svd_vh_of(batch: list[list[list[float]]]) -> list:
    """``torch.linalg.svd(A).Vh`` of ``batch`` on the XLA device, with the kernel in force, as nested
    lists. Compiles a tiny graph."""
    import torch_xla

    out: list = torch.linalg.svd(torch.tensor(batch, device=torch_xla.device())).Vh.cpu().tolist()
    return out


def torch_xla_batched_svd_is_right() -> bool:
    """Whether torch_xla's own ``aten::_linalg_svd`` gives a batch of diagonal matrices their Vh, the
    identity (outside a session)."""
    _outside_sessions("_linalg_svd")
    batch = [[[3.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]], [[5.0, 0.0], [0.0, 4.0]]]
    want = [[[1.0, 0.0], [0.0, 1.0]]] * 3
    return [[[abs(v) for v in row] for row in m] for m in svd_vh_of(batch)] == want


def _matrix_by_matrix(own: Callable[..., object]) -> Callable[..., object]:
    """A kernel over torch_xla's own SVD that runs it on each matrix of a batch and stacks the results."""

    def kernel(keyset: object, a: torch.Tensor, *args: Any, **kwargs: Any) -> object:
        batch = a.shape[:-2]
        if a.dim() < 3 or batch.numel() == 0:
            return own(keyset, a, *args, **kwargs)
        flat = torch.ops.aten.view_copy(a, [-1, *a.shape[-2:]])
        # copies, not views: at this level torch_xla 2.9's SVD of a select() view of the first matrix is
        # wrong (measured on 5 x 5 matrices)
        outs = [
            own(keyset, torch.ops.aten.select_copy(flat, 0, i), *args, **kwargs) for i in range(len(flat))
        ]
        stacked = []
        for parts in zip(*outs):
            first = parts[0]
            stacked.append(first if first.numel() == 0 else torch.stack(parts).reshape(*batch, *first.shape))
        return tuple(stacked)

    return kernel


@frozen
class CorrectBatchedSvd:
    """The effect: the SVD of a batch of matrices as PyTorch's, one matrix at a time, on XLA."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        restores = [installed(op, _matrix_by_matrix, wraps_own=True) for op in SVD_OPS]
        return undo_all(restores)

    def describe(self) -> dict:
        return {"effect": "correct_batched_svd", "device": "xla"}
