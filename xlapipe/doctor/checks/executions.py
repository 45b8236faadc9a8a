"""executions: more than one XLA execution per step (graph cuts), and transfers to the device outside the loader."""

from __future__ import annotations

from collections import Counter

from xlapipe.doctor.findings import Context, Finding, group, plural, seconds


def check(context: Context) -> list[Finding]:
    return [*_cuts(context), *_other_executions(context), *_transfers(context)]


def _cuts(context: Context) -> list[Finding]:
    """Step markers at a second line, in every iteration: each cuts the iteration's graph in two."""
    steps = context.measured
    sites = Counter(s.site for s in steps)
    if len(sites) < 2:
        return []
    updates: Counter = Counter()
    for s in steps:
        updates[s.site] += s.updates
    main = max(sites, key=lambda site: (sites[site], updates[site]))  # a tie: the marker after the update
    at_main = [i for i, s in enumerate(steps) if s.site == main]
    gaps = list(zip(at_main, at_main[1:]))
    found = []
    for site, n in sites.items():
        if site == main or n < 2 or not gaps:
            continue
        inside = sum(any(steps[j].site == site for j in range(a + 1, b)) for a, b in gaps)
        if inside < 2 or inside < len(gaps) / 2:
            continue  # not in every iteration: another loop (evaluation), not a cut
        mine = [s for s in steps if s.site == site]
        per_iteration = inside / len(gaps)
        found.append(
            context.finding(
                "executions",
                site,
                count=per_iteration,
                cost_s=sum(s.sync_s for s in mine) / n * per_iteration,
                detail=f"{plural(per_iteration, 'extra step marker')} per iteration here, besides the one "
                f"at {context.where(main)}: each cuts the iteration's graph in two (one more XLA "
                "execution, nothing fused across the cut); the doctor counts each marker as a step",
                fix="keep one step marker per training step, after the optimizer update "
                "(xlapipe's run.step places it)",
            )
        )
    return found


def _other_executions(context: Context) -> list[Finding]:
    """Executions inside the step that no step marker, read, fallback or compiled region explains.

    A region torch.compile made runs as its own graphs ("dynamo is executing a compiled program"):
    that is what compiling it means. An execution with no frame of the script's is the libraries'.
    """
    unexplained = []
    for step in context.measured:
        lines = {context.frame_of(r) for r in step.reads}
        for a, at_marker in step.executions:
            where = context.timeline.where(a.frames)
            if not at_marker and where is not None and where not in lines and "dynamo" not in a.cause:
                unexplained.append(a)
    found = []
    for (frame, cause), items in group(
        unexplained, lambda a: (context.timeline.where(a.frames), a.cause)
    ).items():
        per_step = context.per_step(len(items))
        if len(items) < 2 or per_step < 0.5:
            continue
        found.append(
            context.finding(
                "executions",
                frame,
                count=per_step,
                cost_s=None,
                detail=f"{plural(per_step, 'XLA execution')} per step before the step marker "
                f"(torch_xla's cause: {cause or 'not given'}): the step runs as several graphs",
                fix="let the step marker run the step's graph: no sync, read or compiled region in the middle",
            )
        )
    return found


def _transfers(context: Context) -> list[Finding]:
    """Host tensors the user's code copies to the device (one a library makes inside its own code,
    e.g. a 0-byte tensor in torch's clip_grad_norm_, is not the user's to move: left out)."""
    transfers = [r for step in context.measured for r in step.transfers if not context.in_library(r)]
    found = []
    for frame, items in group(transfers, context.frame_of).items():
        per_step = context.per_step(len(items))
        steps = sum(any(r in items for r in step.transfers) for step in context.measured)
        if len(items) < 2 or steps < len(context.measured) / 2:
            continue  # once, or now and then: not a cost of the step (a copy in most steps is)
        size = sum(int(r.data.get("bytes") or 0) for r in items) / len(items)
        spent = sum(float(r.data.get("spent_s", 0.0)) for r in items)
        found.append(
            context.finding(
                "executions",
                frame,
                count=per_step,
                cost_s=context.per_step(spent),
                detail=f"{plural(per_step, 'host tensor')} per step copied to the device outside the loader, "
                f"in {steps} of {len(context.measured)} steps "
                f"({size:.0f} bytes, {seconds(spent / len(items))} each): the host waits for each copy",
                fix="create it on the device (torch.ones(..., device=device)) or once before the loop; "
                "data for the step: let the DataLoader give it, and MpDeviceLoader copy it ahead",
            )
        )
    return found
