"""What with_device's corrected kernels cost on the host: tracing with them against torch_xla's own.

    python -m bench.kernel_cost --repeats 30 --out results/kernel-cost/kernel_cost.json

Some corrections (reductions given an empty dimension list, ``diagonal``,
``interpolate``, the SVD) are Python kernels over torch_xla's own, so every
``sum``, ``mean``, ``var``, ``std``, ``diagonal``, nearest or bilinear resize
and SVD on the device passes through Python while a session lasts. In one process, in rounds whose order alternates, this traces
a training step of the small BERT (forward and backward, host time up to the
``torch_xla.sync()``, which is not timed) and 1,000 ``x.mean(-1)`` calls, with
the kernels of ``with_device`` installed and without. Tracing is host work,
the same on a TPU host; what the graphs cost on the device does not change
(the corrections call torch_xla's own kernels with other arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from bench import workloads

CALLS = 1000


def _traced_step(model: torch.nn.Module, batch: dict) -> float:
    import torch_xla

    t0 = time.perf_counter()
    loss = workloads.text_loss(model, batch)
    loss.backward()
    took = time.perf_counter() - t0
    torch_xla.sync()
    model.zero_grad(set_to_none=True)
    return took


def _traced_means(x: torch.Tensor) -> float:
    import torch_xla

    t0 = time.perf_counter()
    for _ in range(CALLS):
        x.mean(-1)
    took = time.perf_counter() - t0
    torch_xla.sync()
    return took / CALLS


# The variants: torch_xla's own kernels, with_device's corrections written as kernels of their own, and
# all of them (with the Python kernels over torch_xla's own: CorrectEmptyDims, CorrectDiagonal,
# CorrectInterpolate, CorrectBatchedSvd).
WRAPPERS = ("CorrectEmptyDims", "CorrectDiagonal", "CorrectInterpolate", "CorrectBatchedSvd")
VARIANTS = ("own", "without_wrappers", "with_device")


def _fixed(variant: str, measure: Callable[[], float]) -> float:
    from xlapipe.transforms.device import KERNEL_FIXES

    fixes = [f for f in KERNEL_FIXES if variant == "with_device" or type(f).__name__ not in WRAPPERS]
    restores = [fix.apply() for fix in fixes] if variant != "own" else []
    try:
        return measure()
    finally:
        for restore in reversed(restores):
            restore()


def measure(repeats: int, smoke: bool = False) -> dict:
    import torch_xla

    device = torch_xla.device()
    work = workloads.get("bert", smoke=smoke)
    model = work.build_model(0).to(device)
    batch = {k: v.to(device) for k, v in next(iter(workloads.loader(work, 1, 0))).items()}
    x = torch.randn(64, 64, device=device)
    cases = {"step": lambda: _traced_step(model, batch), "mean": lambda: _traced_means(x)}
    times = {c: {v: [] for v in VARIANTS} for c in cases}
    for r in range(repeats + 2):  # the first two rounds compile and warm caches: dropped
        for name, case in cases.items():
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]  # each variant first in turn
            for variant in order:
                took = _fixed(variant, case)
                if r >= 2:
                    times[name][variant].append(took)

    def summary(name: str, scale: float, unit: str) -> dict:
        own = times[name]["own"]
        out: dict = {f"{v}_{unit}": statistics.median(times[name][v]) * scale for v in VARIANTS}
        for v in VARIANTS[1:]:  # paired by round
            ratios = sorted(f / o for f, o in zip(times[name][v], own))
            out[f"{v}_vs_own"] = {"median": statistics.median(ratios), "min_max": [ratios[0], ratios[-1]]}
        return out

    return {
        "workload": "kernel_cost",
        "repeats": repeats,
        "model": "bert-tiny" if smoke else "bert-small",
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "step": summary("step", 1e3, "ms"),
        "mean_call": summary("mean", 1e6, "us"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    report = measure(opts.repeats, opts.smoke)
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    with open(opts.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
