"""What xlapipe itself costs: building and applying a pipeline of eight transforms.

    python -m bench.overhead --repeats 200 --out overhead.json

Times ``Pipeline(<eight transforms>)`` (the factories' checks and the
pipeline's relation checks) and ``pipeline(setup)`` (applying them to a
:class:`xlapipe.TrainingSetup` of the small BERT), repeated, median and
spread. Nothing is moved to a device: realising the setup (``session``) is
device copies and is not timed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench import workloads


def eight(length: int):
    """The eight transforms: every practice that combines with the others."""
    from xlapipe import transforms as t

    return [
        t.with_device(),
        t.with_precision("fp32"),
        t.set_default_tensor_type("float32"),
        t.wrap_model_mp(),
        t.static_shapes(length=length, drop_last=("train",)),
        t.wrap_loader_mp(),
        t.compile_step(optimizer=True),
        t.recompile_guard(warmup=3),
    ]


def measure(repeats: int, smoke: bool = False) -> dict:
    import xlapipe as xp

    work = workloads.get("bert", smoke=smoke)
    setup = xp.TrainingSetup(
        work.build_model(0), lambda p: workloads.optimizer(work, p), {"train": workloads.loader(work, 4, 0)}
    )
    build, apply = [], []
    for i in range(repeats + 10):  # the first ten warm caches and are dropped
        t0 = time.perf_counter()
        pipeline = xp.Pipeline(*eight(work.length))
        t1 = time.perf_counter()
        result = pipeline(setup)
        t2 = time.perf_counter()
        if i >= 10:
            build.append(t1 - t0)
            apply.append(t2 - t1)
    assert len(result.applied) == 8 and result.device == "xla"
    total = [b + a for b, a in zip(build, apply)]

    def ms(values: list[float]) -> dict:
        q = statistics.quantiles(values, n=20) if len(values) >= 2 else values * 19
        return {
            "median_ms": statistics.median(values) * 1e3,
            "p5_ms": q[0] * 1e3,
            "p95_ms": q[-1] * 1e3,
            "min_ms": min(values) * 1e3,
        }

    return {
        "workload": "overhead",
        "repeats": repeats,
        "pipeline": repr(pipeline),
        "model_modules": sum(1 for _ in setup.model.modules()),
        "build": ms(build),
        "apply": ms(apply),
        "total": ms(total),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    report = measure(opts.repeats, opts.smoke)
    with open(opts.out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
