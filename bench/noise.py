"""How noisy this machine is, and what that costs the main job: the figures behind its steps and rounds.

    .venv/bin/python -m bench.noise --out results/noise        # make bench-noise (about 8 minutes)

Two measurements, one after the other, nothing else of ours running:

- **the machine alone**: a fixed numpy workload (a 384x384 matmul and a sum
  over 32 MB) on one thread, as many times as fit in each 2-second sample,
  for ``--probe-s`` seconds. Its spread is the machine's own: no XLA, no
  torch, no run of ours.
- **one long run**: the example of the main job (``examples/nlp_example.py``
  with the Makefile's ``ABLATE_ARGS``, but ``--epochs``), its own pipeline
  (the main job's last row), measured by the session as ``xlapipe ablate``
  measures it (:func:`xlapipe.ablation.measure.measured`), which reports every
  measured step's time.

From the run: the spread of the median of ``B`` consecutive steps, for the
block lengths ``B`` a run could measure (``--blocks``), and the seconds a run
of the main job costs besides its measured steps (starting, importing,
compiling, evaluating). From those, for each ``B``: the paired rounds, and
the minutes, that the main job's compared rows would need to see an increment
of 10% and of 5% (80% power, two-sided 95% shared by Holm over the
increments; a normal approximation). The blocks are consecutive steps of one
process, so their spread is a lower bound of the spread between runs, which
also differ in the process: the main job's A/A pair measures that one.

Writes ``results.json`` and ``results.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import run as bench_run
from bench.decide import makefile_words
from xlapipe import child_process
from xlapipe.ablation.harness import job_env

REPO = Path(bench_run.REPO)
EXAMPLE = REPO / "examples" / "nlp_example.py"
SAMPLE_S = 2.0
COMPARED_ROWS = 6  # the main job's rows after the baseline: five increments and the A/A pair
INCREMENTS = 5
POWER = 0.8
EFFECTS = (0.10, 0.05)


def probe(seconds: float) -> list[float]:
    """The machine's speed (work units per second) in samples of ``SAMPLE_S``, on one thread."""
    import numpy as np

    a = np.random.default_rng(0).random((384, 384), dtype=np.float32)
    big = np.random.default_rng(1).random(8_000_000, dtype=np.float32)
    rates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < SAMPLE_S:
            a @ a
            big.sum()
            n += 1
        rates.append(n / (time.perf_counter() - start))
    return rates


def machine(seconds: float, out: Path) -> dict[str, Any]:
    """:func:`probe` in a child process with one thread (no XLA, no torch)."""
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    code = f"import json, bench.noise as n; print(json.dumps(n.probe({seconds!r})))"
    log = out / "probe.log"
    done = child_process.run(
        [sys.executable, "-c", code], log=log, cwd=REPO, env={**os.environ, **env}, limit=seconds + 120
    )
    if done.status != "ended":
        raise SystemExit(f"the machine probe failed ({done.status}): see {log}")
    rates = json.loads(log.read_text().strip().splitlines()[-1])
    logs = [math.log(r) for r in rates]
    return {
        "samples": len(rates),
        "sample_s": SAMPLE_S,
        "rel_sd": statistics.pstdev(logs),
        "lag1_autocorrelation": autocorrelation(logs),
        "slowest_over_fastest": min(rates) / max(rates),
        "rates": rates,
    }


def long_run(epochs: int, out: Path) -> dict[str, Any]:
    """The example's own pipeline for ``epochs`` epochs, measured by the session."""
    args = makefile_words("ABLATE_ARGS")
    at = args.index("--epochs")
    args[at + 1] = str(epochs)
    report = out / "run.json"
    env = {**os.environ, **job_env(str(report), None, warmup=3, discover=False)}
    done = child_process.run(
        [sys.executable, str(EXAMPLE), *args], log=out / "run.log", cwd=REPO, env=env, limit=3600
    )
    if done.status != "ended" or not report.exists():
        raise SystemExit(f"the long run failed ({done.status}): see {out / 'run.log'}")
    measured = json.loads(report.read_text())
    times = measured["step_times_s"]
    return {
        "epochs": epochs,
        "wall_s": done.elapsed_s,
        "measured_steps": len(times),
        "step_s": statistics.median(times),
        "warmup_steps": measured["warmup_steps"],
        # what is not a step at the steady pace: start, imports, compilation, evaluation (less a
        # compilation after the warm-up, which a run of the main job does not reach)
        "fixed_s": done.elapsed_s
        - measured["steps"] * statistics.median(times)
        - measured.get("compile_s_after_warmup", 0.0),
        "compile_s": measured["compile_s_total"] - measured.get("compile_s_after_warmup", 0.0),
        "step_times_s": times,
    }


def autocorrelation(xs: list[float]) -> float:
    """The lag-1 autocorrelation of ``xs`` (near 0: independent samples; near 1: a slow drift)."""
    mean = statistics.fmean(xs)
    den = sum((x - mean) ** 2 for x in xs)
    return sum((a - mean) * (b - mean) for a, b in zip(xs, xs[1:])) / den if den else 0.0


def block_spread(times: list[float], block: int) -> float | None:
    """The standard deviation of the log median of consecutive ``block``-step blocks (None: under 3)."""
    medians = [
        math.log(statistics.median(times[i : i + block])) for i in range(0, len(times) - block + 1, block)
    ]
    return statistics.stdev(medians) if len(medians) >= 3 else None


def rounds_needed(run_sd: float, effect: float, comparisons: int = INCREMENTS) -> float:
    """Paired rounds to detect ``effect`` with POWER, the 5% shared by Holm over ``comparisons`` (its
    strictest level), when one run's log figure has standard deviation ``run_sd``."""
    z = statistics.NormalDist()
    crit = z.inv_cdf(1 - 0.05 / comparisons / 2) + z.inv_cdf(POWER)
    return (crit * math.sqrt(2) * run_sd / math.log(1 + effect)) ** 2


def plan(run: dict[str, Any], blocks: list[int]) -> list[dict[str, Any]]:
    """For each block length: one run's spread, its cost, and the rounds and minutes per effect."""
    rows = []
    for block in blocks:
        sd = block_spread(run["step_times_s"], block)
        if sd is None:
            continue
        run_s = run["fixed_s"] + (block + run["warmup_steps"] + 1) * run["step_s"]  # and an epoch's first
        row: dict[str, Any] = {"block": block, "run_sd": sd, "run_s": run_s}
        for effect in EFFECTS:
            n = max(2, math.ceil(rounds_needed(sd, effect)))
            row[f"rounds_{effect:g}"] = n
            row[f"minutes_{effect:g}"] = n * COMPARED_ROWS * run_s / 60
        rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    m, r = result["machine"], result["run"]
    lines = [
        "# This machine's noise, and what it costs the main job",
        "",
        f"Started {result['when']} on commit {result['env']['commit']} ({result['env']['cpus']} CPUs). "
        "`python -m bench.noise`.",
        "",
        f"**The machine alone** (a fixed numpy workload on one thread, {m['samples']} samples of "
        f"{m['sample_s']:g} s): its speed varies by {m['rel_sd']:.1%} (standard deviation), the slowest "
        f"sample {m['slowest_over_fastest']:.2f} of the fastest; neighbouring samples correlate "
        f"{m['lag1_autocorrelation']:.2f} (lag 1): "
        + (
            "a drift over many seconds, which longer runs average only slowly."
            if m["lag1_autocorrelation"] > 0.3
            else "close to independent samples."
        ),
        "",
        f"**One long run** of the main job's last row ({r['epochs']} epochs, {r['measured_steps']} measured "
        f"steps, median step {r['step_s']:.3f} s, {r['wall_s']:.0f} s in all): a run costs about "
        f"{r['fixed_s']:.0f} s besides its steps (start, imports, {r['compile_s']:.0f} s of compilation, "
        "evaluation).",
        "",
        "| steps measured per run | spread of one run (sd of the log median) | seconds per run "
        "| paired rounds for 10% | minutes for 10% | paired rounds for 5% | minutes for 5% |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result["plan"]:
        lines.append(
            f"| {p['block']} | {p['run_sd']:.1%} | {p['run_s']:.0f} | {p['rounds_0.1']} | "
            f"{p['minutes_0.1']:.0f} | {p['rounds_0.05']} | {p['minutes_0.05']:.0f} |"
        )
    lines += [
        "",
        f"Minutes: the {COMPARED_ROWS} rows the main job compares after its baseline (five increments and "
        "the A/A pair), each run once per round; the baseline's and the eager row's rounds come on top. "
        f"Rounds: to see the effect with {POWER:.0%} power, the 5% shared by Holm over the "
        f"{INCREMENTS} increments (its strictest level), a normal approximation. The spreads are of "
        "consecutive steps in one process: between runs, which also differ in the process, the spread "
        "is larger (the main job's A/A pair measures it), so these are the least rounds.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noise", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "noise")
    parser.add_argument("--probe-s", type=float, default=150.0, help="seconds of the machine probe")
    parser.add_argument("--epochs", type=int, default=24, help="epochs (12 steps each) of the long run")
    parser.add_argument("--blocks", default="6,12,24,48,96", help="block lengths (steps) to judge")
    opts = parser.parse_args(argv)
    blocks = [int(b) for b in opts.blocks.split(",")]
    if opts.epochs < 2 or opts.probe_s < 3 * SAMPLE_S or not blocks or min(blocks) < 2:
        parser.error("give --epochs of 2 or more, --probe-s of 6 or more and block lengths of 2 or more")
    opts.out.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result: dict[str, Any] = {"when": when, "env": bench_run.environment()}
    result["machine"] = machine(opts.probe_s, opts.out)
    result["run"] = long_run(opts.epochs, opts.out)
    result["plan"] = plan(result["run"], blocks)
    (opts.out / "results.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (opts.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
