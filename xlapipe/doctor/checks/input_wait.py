"""input_bound: the share of the step spent waiting for the next batch, reported when it is large.

With torch_xla's device loader the wait can be hidden: its queues, filled
while the first graphs compiled, hand out batches the host loader made then.
The probe notes how many batches the queues held at each step; when they drain
through the measured steps, the host loader is slower than the step, and the
finding says by how much, and how many steps would show the wait itself.
"""

from __future__ import annotations

from collections import Counter

from xlapipe.doctor.findings import Context, Finding, seconds
from xlapipe.doctor.timeline import Step

SHARE = 0.25  # of the step time
LEAST_S = 0.005  # per step: a smaller wait is noise next to a real data pipeline
DRAINED = 3  # batches the queues must lose over the measured steps to be draining (not jitter)
DRAIN_RATE = 0.15  # batches lost per step, at least (the host loader then makes under 0.85 per step)
MEASURED = 6  # steps with the queues' depth, at least, to judge a drain
LEAST_MADE = 0.1  # batches per step the estimate assumes at least (a smaller rate is noise)


HOST_LOADER_FIX = (
    "the device loader waits for the host loader: give the DataLoader workers "
    "(num_workers=2 or more, persistent_workers=True) or make __getitem__ and collate_fn cheaper"
)


def check(context: Context) -> list[Finding]:
    steps, emptied = _steady(context)
    wait = sum(s.wait_s for s in steps)
    total = sum(s.step_s for s in steps)
    if not steps or total <= 0:
        return []
    per_step = wait / len(steps)
    if wait / total < SHARE or per_step < LEAST_S:
        return _draining(context)
    sites = Counter(s.loader_site for s in steps if s.loader_site is not None)
    site = sites.most_common(1)[0][0] if sites else None
    device_loader = context.has("wrap_loader_mp") or any(s.device_loader for s in steps)
    detail = (
        f"{wait / total:.0%} of the measured steps' time is spent waiting for the next batch: "
        f"{seconds(per_step)} per step on average (the median step takes {seconds(context.median_step_s)})"
    )
    if emptied is not None:
        detail += (
            f"; counted from step {emptied}, when the device loader's queues (filled while the first "
            "graphs compiled) first ran empty: the steady state"
        )
    if device_loader:
        fix = HOST_LOADER_FIX
        practice = None
    else:
        fix = (
            "prepare batches in the background: DataLoader(num_workers=2 or more, persistent_workers=True), "
            "and torch_xla's MpDeviceLoader to copy them to the device ahead of the step "
            "(xlapipe: wrap_loader_mp(), its loader_prefetch_size and device_prefetch_size queues)"
        )
        practice = {"name": "wrap_loader_mp", "params": {}}
    return [
        context.finding(
            "input_bound", site, count=1.0, cost_s=per_step, detail=detail, fix=fix, practice=practice
        )
    ]


def _steady(context: Context) -> tuple[list[Step], int | None]:
    """The measured steps from the one where the device loader's queues first ran empty (before the
    epoch's end), and that step's number; every measured step, and None, when they never did (or too
    late to judge the rest). Before it, the queues hide a slow host loader."""
    steps = context.measured
    first = next((i for i, s in enumerate(steps) if s.queued == 0 and not s.loader_ended), None)
    if first is None or first == 0 or len(steps) - first < MEASURED:
        return steps, None
    return steps[first:], steps[first].index


def _draining(context: Context) -> list[Finding]:
    """The finding for a device loader whose queues drain through the measured steps, or none."""
    # the queues empty at the epoch's end by themselves: only the steps before the host loader ended
    steps = [s for s in context.measured if s.queued is not None and not s.loader_ended]
    if len(steps) < MEASURED or len(steps) < len(context.measured) // 2:
        return []
    depths = [s.queued for s in steps if s.queued is not None]
    lost = max(depths[: len(depths) // 2]) - depths[-1]
    rate = -_slope(depths)  # batches lost per step: the step takes one, the host loader adds 1 - rate
    if lost < DRAINED or rate < DRAIN_RATE:
        return []
    made = max(LEAST_MADE, 1.0 - rate)
    step_s = context.median_step_s
    cost = step_s * (1 / made - 1)  # once empty: a batch every step_s / made, the step itself step_s
    left = depths[-1]
    about = "about" if made > LEAST_MADE else "at most"
    detail = (
        f"the device loader's queues drained from {max(depths[: len(depths) // 2])} to {left} batches "
        f"over the {len(steps)} steps measured ({rate:.2f} a step): the host loader makes {about} "
        f"{made:.2f} batches per step, so once the queues are empty each step will wait about "
        f"{seconds(cost)} for its batch (the step takes {seconds(step_s)})"
    )
    if left:
        more = int(left / rate) + 1
        detail += (
            f". The run was too short to see that wait: about {more} more steps would empty them "
            f"(--steps {len(context.timeline.steps) + more})"
        )
    sites = Counter(s.loader_site for s in steps if s.loader_site is not None)
    site = sites.most_common(1)[0][0] if sites else None
    return [
        context.finding(
            "input_bound", site, count=1.0, cost_s=cost, detail=detail, fix=HOST_LOADER_FIX, practice=None
        )
    ]


def _slope(values: list[int]) -> float:
    """The least-squares slope of ``values`` against their index."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den if den else 0.0
