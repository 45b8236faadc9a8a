"""input_bound: the share of the step spent waiting for the next batch, reported when it is large."""

from __future__ import annotations

from collections import Counter

from xlapipe.doctor.findings import Context, Finding, seconds

SHARE = 0.25  # of the step time
LEAST_S = 0.005  # per step: a smaller wait is noise next to a real data pipeline


def check(context: Context) -> list[Finding]:
    steps = context.measured
    wait = sum(s.wait_s for s in steps)
    total = sum(s.step_s for s in steps)
    per_step = context.per_step(wait)
    if not steps or total <= 0 or wait / total < SHARE or per_step < LEAST_S:
        return []
    sites = Counter(s.loader_site for s in steps if s.loader_site is not None)
    site = sites.most_common(1)[0][0] if sites else None
    device_loader = context.has("wrap_loader_mp") or any(s.device_loader for s in steps)
    detail = (
        f"{wait / total:.0%} of the step time is spent waiting for the next batch: "
        f"{seconds(per_step)} of {seconds(total / len(steps))} per step"
    )
    if device_loader:
        fix = (
            "the device loader waits for the host loader: give the DataLoader workers "
            "(num_workers=2 or more, persistent_workers=True) or make __getitem__ and collate_fn cheaper"
        )
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
