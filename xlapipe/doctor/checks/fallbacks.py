"""cpu_fallback: ops with no XLA lowering, run on the CPU (their inputs copied over and back)."""

from __future__ import annotations

from xlapipe.doctor.checks.host_reads import SCALAR_READ
from xlapipe.doctor.events import Frame, Record
from xlapipe.doctor.findings import Context, Finding, compiling_s, group, plural, seconds, spent_s
from xlapipe.doctor.graphs import ops

_DATA_DEPENDENT = "its result's shape depends on the data, so the graph after it changes shape too"
INSTEAD = {
    "aten::nonzero": "boolean-mask indexing (x[mask]) and torch.nonzero give a shape that depends on "
    "the data: keep the shape with torch.where(mask, x, 0) or a masked sum (x * mask).sum()",
    "aten::masked_select": "masked_select gives a shape that depends on the data: use "
    "torch.where(mask, x, 0) or a masked sum (x * mask).sum()",
    "aten::_unique2": "torch.unique: count with one_hot(x, num_classes).sum(0) over a known number "
    "of classes, or take it out of the step",
    "aten::bincount": "torch.bincount: one_hot(x, num_classes).sum(0), or zeros(n).scatter_add_(0, x, "
    "ones) with a known length n",
    "aten::histc": "torch.histc: compute bucket indices ((x - lo) / width).long() and count them with "
    "one_hot(...).sum(0)",
    "aten::median.dim_values": "torch.median(x, dim): x.kthvalue((x.shape[dim] + 1) // 2, dim) gives "
    "the same lower median and runs on XLA",
    "aten::median": "torch.median(x): x.flatten().kthvalue((x.numel() + 1) // 2) runs on XLA",
    "aten::searchsorted": "torch.searchsorted: (x.unsqueeze(-1) >= boundaries).sum(-1) for a short "
    "list of boundaries",
    "aten::glu_backward": "F.glu's backward has no XLA lowering: write glu as a, b = x.chunk(2, dim); "
    "a * torch.sigmoid(b), whose backward XLA lowers",
    "aten::_pdist_backward": "F.pdist's backward has no XLA lowering: take the index pairs once, outside "
    "the step (i, j = torch.triu_indices(n, n, 1), moved to the device), then (x[i] - x[j]).norm(dim=-1) "
    "gives the same distances with a lowered backward",
    "aten::_cdist_backward": "torch.cdist's backward has no XLA lowering: (a[:, None] - b[None]).norm(dim=-1) "
    "gives the same (p=2) distances with a lowered backward",
    "aten::upsample_bilinear2d_backward": "F.interpolate(mode='bilinear')'s backward has no XLA lowering: "
    "resize with two matrix products built once on the host, M = lambda n, m: F.interpolate(torch.eye(n)"
    "[None, None], size=(n, m), mode='bilinear', align_corners=ac)[0, 0].T, then M(H, oh) @ x @ M(W, ow).T "
    "(the matrices moved to the device once; the same numbers, for a size= call)",
    "aten::upsample_nearest2d_backward": "F.interpolate(mode='nearest')'s backward has no XLA lowering: "
    "index with the source rows and columns, idx = lambda n, m: F.interpolate(torch.arange(n, dtype="
    "torch.float)[None, None], size=m, mode='nearest')[0, 0].long(), then x[..., idx(H, oh)[:, None], "
    "idx(W, ow)] (the indices moved to the device once)",
    "aten::huber_loss": "F.huber_loss: delta * F.smooth_l1_loss(x, y, beta=delta) gives the same loss on XLA",
    "aten::_embedding_bag": "F.embedding_bag over a 2-D index: F.embedding(idx, weight).sum(1) (or .mean(1)); "
    "over 1-D indices with offsets, a bag-membership matrix built once, S @ F.embedding(idx, weight)",
    "aten::im2col": "F.unfold(x, k, stride=s, padding=p, dilation=d): F.conv2d(x.flatten(0, 1)[:, None], "
    "torch.eye(k * k).view(k * k, 1, k, k).to(x), stride=s, padding=p, dilation=d).reshape(x.shape[0], "
    "x.shape[1] * k * k, -1) gives the same columns on XLA",
    "aten::_logcumsumexp": "torch.logcumsumexp(x, -1): torch.logsumexp(x.unsqueeze(-2) + torch.full((n, n), "
    "float('-inf')).triu(1).to(x), dim=-1) (n the last dimension; n x n memory)",
    "aten::_adaptive_avg_pool2d": "an adaptive average pool whose output does not divide the input: "
    "P = lambda n, m: F.adaptive_avg_pool1d(torch.eye(n)[None], m)[0].T, then P(H, oh) @ x @ P(W, ow).T "
    "(the matrices moved to the device once)",
    "aten::bucketize.Tensor": "torch.bucketize(x, b): (x.unsqueeze(-1) > b).sum(-1) ('>=' for right=True), "
    "for a short list of boundaries",
    "aten::searchsorted.Tensor": "torch.searchsorted(b, x): (x.unsqueeze(-1) > b).sum(-1) ('>=' for "
    "right=True), for a short list of boundaries",
    "aten::renorm": "torch.renorm: n = torch.linalg.vector_norm(x, p, dim=[the other dims], keepdim=True); "
    "x * torch.where(n > maxnorm, maxnorm / (n + 1e-7), 1.0)",
}
GENERIC = "replace it with ops XLA lowers, or move it out of the training step"


def check(context: Context) -> list[Finding]:
    calls = [
        (r, op)
        for step in context.measured
        for r in step.reads
        for op in (r.data.get("ops") or {})
        if op != SCALAR_READ
    ]
    found = []
    located: dict[str, float] = {}
    # in the order the forward ops ran: a backward op with several forward lines goes to the first
    forward = list(dict.fromkeys((context.frame_of(r), op) for r, op in calls if not in_backward(r)))

    def blamed(call: tuple[Record, str]) -> tuple[Frame | None, str]:
        """A fallback in the backward pass is the forward op's, at the line that called it."""
        read, op = call
        if not in_backward(read):
            return context.frame_of(read), op
        same = next((key for key in forward if key[1] == op), None)
        if same is not None:
            return same
        return _forward_line(context, op) or context.frame_of(read), op

    for (frame, op), items in group(calls, blamed).items():
        n = sum(float(r.data["ops"][op]) for r, _ in items)
        located[op] = located.get(op, 0.0) + n
        if n < 2:
            continue
        spent = sum(spent_s(r) for r, _ in items)
        ran = sum(float(r.data.get("executions", 0)) for r, _ in items)
        backward = [r for r, _ in items if in_backward(r)]
        detail = _detail(context, op, n, spent, ran) + compiling_s(r for r, _ in items)
        if backward:
            at = context.where(context.frame_of(backward[0]))
            detail += (
                f"; {plural(context.per_step(len(backward)), 'time')} per step in the backward pass "
                f"(at {at}), for the forward op at this line"
            )
        found.append(
            context.finding(
                "cpu_fallback",
                frame,
                count=context.per_step(n),
                cost_s=context.per_step(spent),
                detail=detail,
                fix=INSTEAD.get(op, GENERIC),
            )
        )
    counted: dict[str, float] = {}
    for step in context.measured:
        for op, n in step.fallbacks.items():
            if op != SCALAR_READ:
                counted[op] = counted.get(op, 0.0) + n
    for op, n in counted.items():
        unseen = n - located.get(op, 0.0)
        if unseen >= 2:  # counted by torch_xla, in a thread the probe does not watch
            found.append(
                Finding(
                    "cpu_fallback",
                    "",
                    count=context.per_step(unseen),
                    cost_s=None,
                    detail=f"{op} ran on the CPU {plural(context.per_step(unseen), 'time')} per step, "
                    "called from a thread the doctor does not watch (no line known)",
                    fix=INSTEAD.get(op, GENERIC),
                )
            )
    return found


def in_backward(read: Record) -> bool:
    """Whether the call ran in autograd's backward pass (``loss.backward()``, ``torch.autograd.grad``)."""
    return read.data.get("func") in ("backward", "grad") or any(
        f.function in ("backward", "_engine_run_backward") and "torch" in f.file for f in read.frames()
    )


def _forward_line(context: Context, op: str) -> Frame | None:
    """The user's line that traced the forward op of a backward op (``aten::glu_backward``: ``aten::glu``)."""
    name = op.split(".")[0]
    if not name.endswith("_backward"):
        return None
    forward = name[: -len("_backward")]
    for noted in context.timeline.all("forward_op"):  # the probe saw the call at the user's line
        if noted.data.get("op") == forward and context.frame_of(noted) is not None:
            return context.frame_of(noted)
    for ir in context.timeline.graphs.values():  # else the IR's location, when it is the user's
        for o in ops(ir):
            if o.op == forward and o.location:
                frame = context.frame_at(o.location)
                if frame is not None:
                    return frame
    return None


def _detail(context: Context, op: str, n: float, spent: float, ran: float) -> str:
    text = (
        f"{op} ran on the CPU {plural(context.per_step(n), 'time')} per step: its inputs are copied "
        f"to the host{' (running the graph traced so far)' if ran else ''}, computed there and "
        f"copied back; {seconds(spent / n)} each"
    )
    if op in ("aten::nonzero", "aten::masked_select", "aten::_unique2"):
        text += f"; {_DATA_DEPENDENT}"
    return text
