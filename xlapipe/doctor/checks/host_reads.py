"""host_read: a device value read on the host inside the step (``.item()``, ``float(t)``, ``if t:``, ``print(t)``)."""

from __future__ import annotations

from xlapipe.doctor.events import Record
from xlapipe.doctor.findings import Context, Finding, compiling_s, group, plural, seconds, spent_s

SCALAR_READ = "aten::_local_scalar_dense"  # torch_xla counts every scalar read as this "fallback"
SHOWN = {
    "item": ".item()",
    "__float__": "float(t)",
    "__int__": "int(t)",
    "__index__": "t used as an index",
    "__bool__": "bool(t) / if t:",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "__array__": "numpy.asarray(t)",
    "cpu": ".cpu()",
    "to": ".to('cpu')",
    "__repr__": "print(t) / repr(t)",
    "__str__": "str(t)",
    "__format__": "an f-string or format(t)",
}


def is_fallback(read: Record) -> bool:
    """A CPU fallback rather than a plain read (the op itself has no XLA lowering)."""
    return any(op != SCALAR_READ for op in read.data.get("ops") or {})


def check(context: Context) -> list[Finding]:
    reads = [r for step in context.measured for r in step.reads if not is_fallback(r)]
    found = []
    for frame, items in group(reads, context.frame_of).items():
        n = len(items)
        executions = sum(float(r.data.get("executions", 0)) for r in items)
        every_step = n >= len(context.measured)
        if n < 2 or (executions == 0 and not every_step):
            continue  # once, or an already computed value read now and then: no slow-down to speak of
        how = sorted({SHOWN.get(str(r.data.get("func")), str(r.data.get("func"))) for r in items})
        spent = sum(spent_s(r) for r in items)
        per_step = context.per_step(n)
        if executions:
            effect = (
                f"{plural(context.per_step(executions), 'extra XLA execution')} per step: the graph "
                "traced so far runs to give the value, and the rest of the step is a second graph"
            )
        else:
            effect = (
                "no extra execution (the value is read after the step marker), but the host waits "
                "for the device to finish the step before it can trace the next one"
            )
        detail = (
            f"{plural(per_step, 'read')} per step ({', '.join(how)}); {effect}; {seconds(spent / n)} per read"
            + compiling_s(items)
        )
        branch = all(r.data.get("func") == "__bool__" for r in items)
        found.append(
            context.finding(
                "host_read",
                frame,
                count=per_step,
                cost_s=context.per_step(spent),
                detail=detail,
                fix=_fix(context, branch),
                practice=None if branch else {"name": "log_every", "params": {"every": 10}},
            )
        )
    return found


def _fix(context: Context, branch: bool) -> str:
    if branch:
        return (
            "a branch on a device value reads it: compute both sides and pick with torch.where, "
            "or decide from values the host already has"
        )
    if context.uses_xlapipe:
        return (
            "read values after the step, every N steps: log_every(10) logs loss, gradient norm "
            "and learning rate without a sync (or read run.values after a step marker)"
        )
    return (
        "keep the value on the device and read it every N steps, after torch_xla.sync() "
        "(or in xm.add_step_closure): it is then already computed; xlapipe's log_every(10) does this"
    )
