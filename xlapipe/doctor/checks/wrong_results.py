"""wrong_result: a call torch_xla 2.9 computes wrong, without an error or a warning.

Measured on torch_xla 2.9 (tests/test_kernel_fixes.py holds each defect):

- ``F.elu``, ``F.celu``, ``F.selu`` (and ``nn.ELU``, ``nn.CELU``, ``nn.SELU``): the forward is right, the
  gradient below 0 is ``1 + x`` instead of ``exp(x)``; the model trains on wrong gradients.
- ``torch.norm`` / ``Tensor.norm`` with ``p=inf`` or ``-inf``: the value and its gradient are wrong.

The probe notes such a call at the user's line when it runs on the XLA device (an elu only when its
gradient is needed), unless xlapipe's corrected kernel is in force (a session with ``with_device``).
"""

from __future__ import annotations

from xlapipe.doctor.findings import Context, Finding

ELU = (
    "torch_xla 2.9's gradient of {f} is wrong below 0 ({wrong} instead of {right}), with no error: the "
    "layers before it train on wrong gradients"
)
WRONG = {
    "elu": ELU.format(f="elu", wrong="1 + x", right="exp(x)"),
    "celu": ELU.format(
        f="celu", wrong="a function of the input taken for the output", right="exp(x / alpha)"
    ),
    "selu": ELU.format(
        f="selu", wrong="a function of the input taken for the output", right="scale * alpha * exp(x)"
    ),
    "norm": "torch_xla 2.9's norm with p=inf or -inf is wrong, its value and its gradient (measured: 1.0 "
    "for a largest magnitude of 2.18), with no error",
}
LOWERED = {
    "elu": "torch.where(x > 0, x, alpha * torch.expm1(x.clamp(max=0))) in place of F.elu(x, alpha)",
    "celu": "torch.where(x > 0, x, alpha * torch.expm1(x.clamp(max=0) / alpha)) in place of F.celu(x, alpha)",
    "selu": "1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * torch.expm1(x.clamp(max=0))) "
    "in place of F.selu(x)",
    "norm": "torch.linalg.vector_norm(x, float('inf'), dim) in place of x.norm(p=float('inf'), dim=dim)",
}


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
                fix=f"write {LOWERED[func]} (the same numbers, computed right on XLA); or train in an xlapipe "
                "session with with_device, which corrects torch_xla's kernel while it lasts",
            )
        )
    return found
