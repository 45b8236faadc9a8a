"""wrong_result: a call torch_xla 2.9 computes wrong, without an error or a warning.

Measured on torch_xla 2.9; with_device corrects each while a session lasts (tests/test_kernel_fixes.py
holds the defects):

- ``F.elu``, ``F.celu``, ``F.selu`` (and their modules): the gradient below 0;
- ``torch.norm`` / ``Tensor.norm`` with ``p=inf`` or ``-inf``: value and gradient;
- ``x.amax()`` / ``x.amin()`` with no dimension: x comes back unreduced;
- ``sum``, ``mean``, ``var``, ``std`` given an empty dimension list: no reduction either;
- ``torch.diagonal(x)`` over dims 0 and 1 of a tensor of 3 or more dimensions: the last two's diagonal;
- ``F.interpolate(x, scale_factor=s)`` in nearest or bilinear mode when ``s`` does not give whole
  sizes: the output size's ratio is used in place of ``s``;
- ``torch.svd`` / ``torch.linalg.svd`` of a batch: V (Vh) comes back with its batch dimension last.

The probe notes such a call at the user's line when it runs on the XLA device (an elu only when its
gradient is needed), unless xlapipe's corrected kernel is in force (a session with ``with_device``).
"""

from __future__ import annotations

from xlapipe.doctor.findings import Context, Finding
from xlapipe.doctor.probe import WRONG_ON_XLA

ELU = (
    "torch_xla 2.9's gradient of {f} is wrong below 0 ({wrong} instead of {right}), with no error: the "
    "layers before it train on wrong gradients"
)
WRONG = {
    "elu": ELU.format(f="elu", wrong="1 + x", right="exp(x)"),
    "celu": ELU.format(f="celu", wrong="1 + x / alpha", right="exp(x / alpha)"),
    "selu": ELU.format(f="selu", wrong="x + 1.758", right="1.758 * exp(x)"),
    "norm": "torch_xla 2.9's norm with p=inf or -inf is wrong, its value and its gradient (measured: 1.0 "
    "for a largest magnitude of 2.18), with no error",
    "amax": "torch_xla 2.9's amax with no dimension returns the tensor unreduced, shape and all (PyTorch "
    "reduces every dimension), with no error: whatever divides by it divides by each element",
    "sum": "torch_xla 2.9 reads an empty dimension list as no reduction (PyTorch: every dimension), and "
    "returns the tensor as it is, with no error",
    "diagonal": "torch_xla 2.9's diagonal over dims 0 and 1 of a tensor with 3 or more dimensions takes "
    "the diagonal of the last two instead (its shape says otherwise), value and gradient, with no error",
    "interpolate": "torch_xla 2.9 resizes by the ratio of the output size to the input size, not by the "
    "scale_factor given, when that scale does not give whole sizes (nearest, and bilinear without "
    "align_corners): other pixels than PyTorch's, with no error",
    "svd": "torch_xla 2.9's SVD of a batch of matrices gives V (Vh) with its batch dimension moved last, "
    "with no error when the shapes happen to fit",
}
WRONG.update(amin=WRONG["amax"].replace("amax", "amin"), linalg_svd=WRONG["svd"])
WRONG.update({name: WRONG["sum"] for name in ("mean", "var", "std")})
LOWERED = {
    "elu": "torch.where(x > 0, x, alpha * torch.expm1(x.clamp(max=0))) in place of F.elu(x, alpha)",
    "celu": "torch.where(x > 0, x, alpha * torch.expm1(x.clamp(max=0) / alpha)) in place of F.celu(x, alpha)",
    "selu": "1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * torch.expm1(x.clamp(max=0))) "
    "in place of F.selu(x)",
    "norm": "torch.linalg.vector_norm(x, float('inf'), dim) in place of x.norm(p=float('inf'), dim=dim)",
    "amax": "x.amax(dim=tuple(range(x.dim()))) (every dimension named), or x.max()",
    "sum": "the reduction without a dim argument (x.sum(), x.mean(), x.var()) or with dim=None",
    "diagonal": "torch.diagonal(x.movedim((0, 1), (-2, -1)), offset, -2, -1), the same diagonal from the "
    "last two dimensions",
    "interpolate": "the same resize as two matrix products built on the host, M = lambda n: "
    "F.interpolate(torch.eye(n)[None, None], scale_factor=(1, s), mode=mode)[0, 0].T, then M(H) @ x @ "
    "M(W).T (the matrices moved to the device once: PyTorch's own numbers)",
    "svd": "one matrix at a time, torch.stack([torch.linalg.svd(a).Vh for a in A]), or "
    "torch.linalg.svdvals(A) when only the singular values are needed",
}
LOWERED.update(amin=LOWERED["amax"].replace("amax", "amin").replace("x.max()", "x.min()"))
LOWERED.update(linalg_svd=LOWERED["svd"], **{name: LOWERED["sum"] for name in ("mean", "var", "std")})
# corrected by with_device's kernels while a session lasts: those the probe knows a kernel of
CORRECTED = {name for name, kernel in WRONG_ON_XLA.items() if kernel is not None}


def check(context: Context) -> list[Finding]:
    found = []
    for record in context.timeline.all("wrong_op"):
        func = str(record.data.get("func"))
        if func not in WRONG:
            continue
        frame = context.frame_of(record)
        found.append(
            context.finding(
                "wrong_result",
                frame,
                count=1.0,
                cost_s=None,
                detail=WRONG[func],
                fix=f"write {LOWERED[func]} (the same numbers, computed right on XLA)"
                + (
                    "; or train in an xlapipe session with with_device, which corrects torch_xla's kernel "
                    "while it lasts"
                    if func in CORRECTED
                    else ""
                ),
            )
        )
    return found
