"""recompile: graphs compiled after warm-up where the same line already ran another graph, and what changed.

A line's first graph is never a recompilation (the first evaluation batch, a
new code path); a compilation seen once is not a finding.
"""

from __future__ import annotations

import re
from collections import Counter

from attrs import frozen

from xlapipe.doctor.checks.fallbacks import GENERIC, INSTEAD
from xlapipe.doctor.events import Frame
from xlapipe.doctor.findings import Context, Finding, group, plural, seconds
from xlapipe.doctor.graphs import Change, compare, dims_of, in_words
from xlapipe.doctor.timeline import Compile

_EARLIER = 6  # graphs a new one is compared with (the last ones of its line)
DATA_DEPENDENT = ("aten::nonzero", "aten::masked_select", "aten::_unique2")
SHORTEST_PAD = 32  # lengths are rounded up to a power of two, at least this


@frozen
class Recompile:
    compiled: Compile
    site: Frame | None
    change: Change | None


def recompilations(context: Context) -> list[Recompile]:
    """Every compilation after warm-up of a line that had already run another graph."""
    timeline = context.timeline
    seen: dict[Frame | None, list[str]] = {}
    out = []
    for step in timeline.steps:
        for compiled in step.compiles:
            site = timeline.where(compiled.analysis.frames)
            earlier = seen.setdefault(site, [])
            graph = compiled.analysis.graph
            if step.index > context.warmup and earlier and graph not in earlier:
                known = [timeline.graphs[h] for h in earlier[-_EARLIER:] if h in timeline.graphs]
                new = timeline.graphs.get(graph)
                out.append(Recompile(compiled, site, compare(new, known) if new and known else None))
            if graph not in earlier:
                earlier.append(graph)
        for analysis, _ in step.executions:
            site = timeline.where(analysis.frames)
            if analysis.graph not in seen.setdefault(site, []):
                seen[site].append(analysis.graph)
    return out


def check(context: Context) -> list[Finding]:
    """One finding per kind of change: a shape change recompiles the marker's graph and a read's alike."""
    found = []
    for kind, events in group(recompilations(context), lambda r: r.change.kind if r.change else "").items():
        if len(events) < 2:
            continue
        at_marker = [e.site for e in events if e.compiled.at_marker]
        site = Counter(at_marker or [e.site for e in events]).most_common(1)[0][0]
        changes = [e.change for e in events if e.change is not None]
        baked = changing_values(context) if kind == "value" else None
        if baked is not None:
            site = baked.frame
        made = data_dependent(context, changes) if kind == "shapes" else None
        if made is not None:
            site = made[0]
        others = sorted({context.where(e.site) for e in events if e.site != site} - {""})
        spent = sum(e.compiled.seconds or 0.0 for e in events)
        detail = (
            f"{plural(len(events), 'new graph')} compiled after warm-up in {len(context.measured)} steps, "
            f"{seconds(spent)} of compiling"
            + (f" (some for the graphs run at {', '.join(others)})" if others else "")
        )
        what = _what_changed(kind, changes)
        fix, practice = _fix(context, kind, changes)
        if baked is not None:
            what, fix = baked.detail(context), baked.fix()
        if made is not None:
            frame, op, change = made
            what = (
                f"the inputs that change ({in_words(change.new_inputs, change.old_inputs, 'N')}) are made "
                f"by {op} at {context.where(frame)}, "
                "which ran on the CPU: their size is the count of what it selects, which changes with "
                "the data (not the batch size)"
            )
            fix, practice = INSTEAD.get(op, GENERIC) + "; the graph then keeps one shape", None
        found.append(
            context.finding(
                "recompile",
                site,
                count=context.per_step(len(events)),
                cost_s=context.per_step(spent),
                detail=f"{detail}; {what}",
                fix=fix,
                practice=practice,
            )
        )
    return found


@frozen
class Baked:
    """A torch call at the user's line whose Python number arguments changed from step to step."""

    frame: Frame | None
    func: str
    steps: int  # measured steps in which they changed
    argument: str  # which argument (its position or name)
    examples: tuple[str, ...]  # its values, in the order seen

    def detail(self, context: Context) -> str:
        shown = ", then ".join(self.examples[:3]) + (", ..." if len(self.examples) > 3 else "")
        what = "the index" if self.func == "__getitem__" else f"argument {self.argument}"
        return (
            f"the same ops on the same shapes, yet a new graph each time: a Python number passed to "
            f"{_call(self.func)} changed in {plural(self.steps, 'step')} of {len(context.measured)} "
            f"({what}: {shown}); torch_xla bakes such a number "
            "(an index, a shift, a size, 0 or 1) into the graph as a constant, so each new value is "
            "a new graph"
        )

    def fix(self) -> str:
        if self.func == "__getitem__":
            return (
                "keep the index on the device: i = torch.zeros(1, dtype=torch.long, device=device) "
                "before the loop, t.index_select(0, i) here instead of t[step_index], and i += 1 "
                "after each step: one graph for every step"
            )
        if self.func == "roll":
            return (
                "torch.roll bakes its shift: pick the shift from a few fixed values (one graph each), "
                "or shift with torch.gather and an index tensor computed on the device"
            )
        return (
            f"pass that number to {_call(self.func)} as a tensor on the device "
            "(torch.tensor(value, device=device)), or keep it the same every step"
        )


def _call(func: str) -> str:
    return "an index t[...]" if func == "__getitem__" else f"{func}()"


def changing_values(context: Context) -> Baked | None:
    """The call whose Python numbers changed in the most measured steps (at least two)."""
    by_site: dict = {}
    for step in context.measured:
        for record in step.values:
            key = (context.frame_of(record), str(record.data.get("func")))
            by_site.setdefault(key, {})[step.index] = record
    if not by_site:
        return None

    def integral(records: dict) -> bool:  # an index, a shift, a size: what torch_xla bakes in
        values = [c[1] for r in records.values() for c in r.data.get("changed") or ()]
        return any(re.fullmatch(r"-?\d+|\(.*\)", str(v)) is not None for v in values)

    # a float that changes (a learning rate as alpha=) becomes device data and bakes nothing: ints first
    (frame, func), steps = max(by_site.items(), key=lambda item: (integral(item[1]), len(item[1])))
    if len(steps) < 2:
        return None
    changes = [tuple(c) for r in steps.values() for c in r.data.get("changed") or ()]
    argument = Counter(c[0] for c in changes).most_common(1)[0][0] if changes else "?"
    examples = tuple(dict.fromkeys(value for place, value in changes if place == argument))
    return Baked(frame, func, len(steps), argument, examples)


def data_dependent(context: Context, changes: list[Change]) -> tuple[Frame, str, Change] | None:
    """(line, op, change) when the inputs whose shape changed were made by a data-dependent op that
    ran on the CPU at a line of the user's (``x[mask]``, ``nonzero``, ``unique``)."""
    fallbacks: dict[Frame, str] = {}
    for step in context.timeline.steps:
        for read in step.reads:
            for op in read.data.get("ops") or {}:
                frame = context.frame_of(read)
                if op in DATA_DEPENDENT and frame is not None:
                    fallbacks.setdefault(frame, op)
    for change in changes:
        for location in change.new_input_sites:
            frame = context.frame_at(location)
            if frame is not None and frame in fallbacks:
                return frame, fallbacks[frame], change
    return None


def _what_changed(kind: str, changes: list[Change]) -> str:
    mine = [c for c in changes if c.kind == kind]
    if not mine:
        return "torch_xla kept no IR of these graphs to compare"
    if kind == "shapes":
        pairs = list(dict.fromkeys((c.new_inputs, c.old_inputs) for c in mine))
        shown = "; ".join(in_words(new, old) for new, old in pairs[:3])
        more = f" (and {len(pairs) - 3} more)" if len(pairs) > 3 else ""
        return f"input shapes changed against the closest earlier graph: {shown}{more}"
    return mine[0].describe()


def longest_seen(context: Context, changes: list[Change], dims: set[int]) -> int:
    """The longest size along ``dims`` of any graph input of the run shaped like the changing ones:
    the data's longest batch seen, warm-up included, not only the newest graph's."""
    from xlapipe.doctor.graphs import ops

    def fixed(d: tuple[str, tuple[int, ...]]) -> tuple:  # the dtype and the sizes that do not vary
        return (d[0], len(d[1]), tuple(n for i, n in enumerate(d[1]) if i not in dims))

    kinds = {fixed(d) for c in changes for s in c.new_inputs + c.old_inputs if (d := dims_of(s))}
    longest = 0
    for ir in context.timeline.graphs.values():
        for o in ops(ir):
            d = dims_of(o.shape) if o.op == "xla::device_data" else None
            if d is not None and fixed(d) in kinds:
                longest = max([longest, *(d[1][i] for i in dims if i < len(d[1]))])
    return longest


def varying(changes: list[Change]) -> dict[int, int]:
    """The dimensions whose size changes between the inputs of the graphs, with the largest size seen."""
    out: dict[int, int] = {}
    for c in changes:
        for new in c.new_inputs:
            for old in c.old_inputs:
                a, b = dims_of(new), dims_of(old)
                if a is None or b is None or a[0] != b[0] or len(a[1]) != len(b[1]):
                    continue
                differ = [i for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y]
                if len(differ) == 1:
                    i = differ[0]
                    out[i] = max(out.get(i, 0), a[1][i], b[1][i])
    return out


def batch_types(context: Context) -> set[str]:
    """The types of the batches DataLoaders handed out ("mapping" for dicts), through the device
    loader or not."""
    return {
        str(r.data.get("batch"))
        for r in context.timeline.all("batch_kind")
        if "DataLoaderIter" in str(r.data.get("loader"))
    }


def _fix(context: Context, kind: str, changes: list[Change]) -> tuple[str, dict | None]:
    if kind == "shapes":
        dims = varying([c for c in changes if c.kind == "shapes"])
        lengths = {i: n for i, n in dims.items() if i > 0}
        if lengths:
            longest = max(max(lengths.values()), longest_seen(context, changes, set(lengths)))
            length = max(SHORTEST_PAD, 1 << (longest - 1).bit_length())
            owner = "" if context.uses_xlapipe else "xlapipe's "
            batches = batch_types(context)
            takes = batches == {"mapping"}  # static_shapes pads a DataLoader's dict batches, nothing else
            how = (
                f"{owner}static_shapes(length={length}) does it"
                if takes
                else f"{owner}static_shapes pads only a DataLoader's dict batches, and "
                + (
                    f"the batches here are {', '.join(sorted(batches))} objects"
                    if batches
                    else "no DataLoader gave these"
                )
                + ": pad them in your own collate_fn"
            )
            return (
                f"pad every batch to one length, in the collate_fn: {length}, the longest batch of the "
                f"{plural(len(context.timeline.steps), 'step')} run here ({longest}) rounded up to a "
                "power of two. That is a guess: your data may hold longer ones (a longer batch is "
                "refused); measure its longest (the max of your dataset's lengths) and use that, or pad "
                f"to a few bucket lengths. {how}; padding "
                "changes the loss unless the padding is masked (attention_mask, labels at -100): "
                "compare the loss before and after",
                {"name": "static_shapes", "params": {"length": length}} if takes else None,
            )
        if 0 in dims:
            sizes = sorted(
                {n for c in changes for shape in c.new_inputs if (d := dims_of(shape)) and (n := d[1][:1])}
            )
            if len([c for c in changes if c.kind == "shapes"]) < 2:
                return (
                    "the batch size changes (a last, smaller batch): DataLoader(drop_last=True), or pad "
                    "the last batch",
                    None,
                )
            return (
                f"the first dimension changes from step to step (sizes {', '.join(str(n[0]) for n in sizes)}): "
                "not one last, smaller batch; pad it to a fixed size (its largest) and mask the padding",
                None,
            )
        return "feed the step tensors of the same shapes every step (pad them)", None
    if kind == "value":
        return (
            "keep that number the same every step, or pass it as a tensor on the device "
            "(torch.tensor(value, device=device)) so the graph stays the same",
            None,
        )
    return (
        "make every step trace the same ops: a Python branch, or a loop whose count depends on "
        "the data or the step number, changes the graph",
        None,
    )
