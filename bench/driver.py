"""The ablation driver's own cost: its memory and time for many records, on simulated runs.

    python -m bench.driver --variants 100 --rounds 10 --machines 8 --out /tmp/driver

The driver (the process that plans, dispatches, analyses and reports) runs
the real rounds, records, analyses after each wave and reports at the end;
only the runs are simulated (:class:`SimulatedEngine`: ``machines`` machines
on a simulated clock, each run a figure drawn around its variant's true
value), so the figures are the driver's alone. It prints one JSON object:
the records written, the driver's peak RSS (MB), the RSS after its imports,
its CPU seconds, and whether torch was loaded (it must not be: importing
torch alone is about 500 MB).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any


class SimulatedEngine:
    """``slots`` machines on a simulated clock: each takes a round and runs it; a run takes ``seconds[name]``."""

    how = "simulated"

    def __init__(self, seconds: dict, noise: float, seed: int, slots: int = 1, truth: dict | None = None):
        self.now, self.truth = [0.0], truth or {}
        self.seconds, self.noise, self.rng, self.slots = seconds, noise, random.Random(seed), slots
        self.started: list[tuple[str, float, float]] = []  # (variant, start, end) on the clock

    def took(self, name: str) -> float:
        times = self.seconds[name]
        done = sum(1 for n, _, _ in self.started if n == name)
        return times[done % len(times)] if isinstance(times, list) else times

    def run_wave(self, rounds, calls):
        start = self.now[0]
        free = [start] * self.slots  # when each machine is next free
        for jobs in rounds:  # a round whole on the machine free first
            m = free.index(min(free))
            for job in jobs:
                self.now[0] = free[m]
                why = calls.admit(job)
                if why:
                    self.now[0] = max(free)
                    return why
                spec = calls.prepare(job)
                calls.starting(job, f"m{m}")
                took = self.took(job.variant.name)
                self.started.append((job.variant.name, free[m], free[m] + took))
                free[m] += took
                value = self.truth.get(job.variant.name, 10.0) * (
                    1 + self.rng.uniform(-self.noise, self.noise)
                )
                outcome = {"status": "ok", "report": {"epoch_s": value, "final_loss": 0.5}, "error": ""}
                calls.finish(job, spec, {**outcome, "elapsed_s": took}, {"host": "sim", "node": f"m{m}"})
        self.now[0] = max(free)
        return ""


def simulated_runner(
    out: Path,
    judging: Any,
    seconds: dict,
    noise: float,
    seed: int = 0,
    slots: int = 1,
    plan: Any = None,
    truth: dict | None = None,
) -> Any:
    """The real rounds and records (:class:`~xlapipe.ablation.runner._Runner`) on simulated machines."""
    from xlapipe.ablation import Output, Runs
    from xlapipe.ablation.runner import Budget, _Runner
    from xlapipe.ablation.target import Target

    class SimulatedRunner(_Runner):
        def __init__(self) -> None:
            engine = SimulatedEngine(seconds, noise, seed, slots, truth)
            self.now, self.started = engine.now, engine.started
            budget = Budget(judging.budget, clock=lambda: self.now[0])
            runs_dir = out / "runs"
            runs_dir.mkdir(parents=True, exist_ok=True)
            output = Output(out, progress=False, echo=None)
            super().__init__(
                plan, Target("m:f", "function"), runs_dir, engine, Runs(), judging, output, budget
            )

    return SimulatedRunner()


def _rss_mb() -> float:
    """This process's peak RSS so far (VmHWM: getrusage's maxrss carries the forking parent's over exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--machines", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True, help="an empty folder (results.jsonl and the reports)")
    opts = ap.parse_args(argv)
    start = time.process_time()
    from xlapipe.ablation import Judging
    from xlapipe.ablation.results import Results
    from xlapipe.ablation.variants import Variant, explicit
    from xlapipe.pipeline import Pipeline

    imported = _rss_mb()
    practices = ["with_device", "wrap_model_mp", "wrap_loader_mp", "set_default_tensor_type"]
    variants = [  # outlines, as the driver holds them
        Variant(
            f"v{i}", Pipeline.from_outline([{"name": p} for p in practices[: i % 5]] + [{"name": f"x{i}"}])
        )
        for i in range(opts.variants)
    ]
    truth = {v.name: 10.0 * (1 + 0.01 * (i % 7)) for i, v in enumerate(variants)}
    judging = Judging(repeats=opts.rounds, until_resolved=False)
    runner = simulated_runner(
        opts.out,
        judging,
        {v.name: 10.0 for v in variants},
        noise=0.05,
        slots=opts.machines,
        plan=explicit(variants),
        truth=truth,
    )
    res = runner.results().with_notes(*runner.run())
    res.write(opts.out)
    again = Results.load(opts.out)  # as `xlapipe report` reads it
    again.table()
    report = {
        "records": sum(1 for _ in open(opts.out / "results.jsonl")),
        "variants": len(again.analysis().summaries),
        "peak_rss_mb": round(_rss_mb(), 1),
        "rss_after_imports_mb": round(imported, 1),
        "cpu_s": round(time.process_time() - start, 2),
        "torch_loaded": "torch" in sys.modules,
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
