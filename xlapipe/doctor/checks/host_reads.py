"""host_read: a device value read on the host inside the step (``.item()``, ``float(t)``, ``if t:``, ``print(t)``)."""

from __future__ import annotations

import os

from xlapipe.doctor.events import Frame, Record
from xlapipe.doctor.findings import Context, Finding, compiling_s, group, plural, seconds, spent_s
from xlapipe.doctor.frames import short

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
                "no extra execution (the value was already computed by an earlier step marker), but "
                "the host waits for the device to finish that step before it can trace on"
            )
        detail = (
            f"{plural(per_step, 'read')} per step ({', '.join(how)}); {effect}; {seconds(spent / n)} per read"
            + compiling_s(items)
        )
        branch = all(r.data.get("func") == "__bool__" for r in items)
        fix = _fix(context, branch)
        practice = None if branch else {"name": "log_every", "params": {"every": 10}}
        library = next((f for r in items if (f := context.library_frame(r)) is not None), None)
        if library is not None:
            detail += (
                f"; the read is inside library code, {library.function} at {_package_path(library)} (called "
                "from this line), not in yours"
            )
            instead, practice = _library_fix(context, library, branch)
            if instead is None:
                continue  # nothing the user can change: left out
            fix = instead
        found.append(
            context.finding(
                "host_read",
                frame,
                count=per_step,
                cost_s=context.per_step(spent),
                detail=detail,
                fix=fix,
                practice=practice,
            )
        )
    return found


def _library_fix(context: Context, library: Frame, branch: bool) -> tuple[str | None, dict | None]:
    """What the user can do about a read inside a library's code (None: nothing)."""
    if f"{os.sep}transformers{os.sep}" in library.file:
        if context.has("hf_traced_masks"):
            return None, None
        owner = "" if context.uses_xlapipe else "xlapipe's "
        return (
            "transformers reads the attention mask on the host in every forward (to drop a mask that "
            f"hides nothing); {owner}hf_traced_masks() makes it build the mask on the device instead; "
            "or pass no attention_mask when no batch has padding",
            {"name": "hf_traced_masks", "params": {}},
        )
    if branch:
        return None, None  # a branch inside torch's own code: not the user's to change
    return (
        f"the library function {library.function} reads it: call it less often (every N steps), or "
        "look for a variant of it that keeps the value on the device",
        None,
    )


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


def _package_path(frame: Frame) -> str:
    """``transformers/masking_utils.py:354``: the path from the package on, not the site-packages folder."""
    for marker in ("site-packages", "dist-packages"):
        at = frame.file.rfind(marker + os.sep)
        if at >= 0:
            return f"{frame.file[at + len(marker) + 1 :]}:{frame.line}"
    return short(frame)
