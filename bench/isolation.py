"""The ablation runner's two isolations side by side: a fresh interpreter per run, or forked runs.

    python -m bench.isolation --out results/bench-isolation          # the main job (make ablate), both ways
    python -m bench.isolation --order static_shapes --no-eager --out /tmp/iso   # two runs each, a first look

Runs ``xlapipe ablate`` with the main job's plan and arguments (the
Makefile's ``ABLATE_PLAN`` and ``ABLATE_ARGS``), one run per variant with the
example following the workload contract (its report has the work it did),
once per isolation and repeat,
``exec`` and ``fork`` in an order rotated by repeat, each into a fresh output
folder. For each it reports the wall time of the whole command, the runs'
own work as the workload measured it (``total_s``: training with its warm-up
and compilations, plus ``eval_s``) and what is left per run: start-up
(interpreter, imports, data) and the runner. From these it also gives the
most that removing all per-run start-up could save on this plan. Writes
``results.json`` and ``results.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.run import REPO, environment
from xlapipe.ablation.results import RESULTS_FILE, load

# The main job, as in the Makefile (tests/test_bench.py checks that the two agree).
MAIN_ORDER = "static_shapes,hf_traced_masks,wrap_model_mp,wrap_loader_mp,set_default_tensor_type"
MAIN_ARGS = [
    "--size",
    "small",
    "--epochs",
    "1",
    "--max-steps",
    "12",
    "--warmup",
    "3",
    "--train-size",
    "192",
    "--eval-size",
    "32",
]
ISOLATIONS = ("exec", "fork")


def command(
    isolation: str, out: str, order: str, eager: bool, timeout: float, args: list[str] = MAIN_ARGS
) -> list[str]:
    """``xlapipe ablate`` of the main job's target with one isolation."""
    plan = ["--mode", "add-one", "--baseline", "with_device", "--order", order]
    plan += ["--eager-reference"] if eager else []
    plan += ["--contract", "--repeats", "1", "--no-until-resolved"]  # one run each; the script's own report
    return [
        sys.executable,
        "-m",
        "xlapipe.cli",
        "ablate",
        "examples/nlp_example.py",
        "--out",
        out,
        *plan,
        "--timeout",
        str(timeout),
        "--isolation",
        isolation,
        "--no-progress",
        "--",
        *args,
    ]


def run_one(isolation: str, repeat: int, opts: argparse.Namespace) -> dict[str, Any]:
    """One whole ablation; its wall time and each run's elapsed time, own work and start-up."""
    out = os.path.join(opts.out, "ablations", f"{isolation}.r{repeat}")
    shutil.rmtree(out, ignore_errors=True)  # a fresh folder: nothing resumed
    cmd = command(isolation, out, opts.order, not opts.no_eager, opts.timeout, opts.args or MAIN_ARGS)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    with open(os.path.join(opts.out, "logs", f"{isolation}.r{repeat}.log"), "w") as log:
        log.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    runs = []
    for record in load(os.path.join(out, RESULTS_FILE)):
        if record["status"] != "ok":
            raise SystemExit(f"{isolation} repeat {repeat}: {record['variant']} {record['status']}")
        report = record["report"]
        work = report["total_s"] + report["eval_s"]
        runs.append(
            {
                "variant": record["variant"],
                "elapsed_s": record["elapsed_s"],
                "work_s": work,
                "startup_s": record["elapsed_s"] - work,
                "isolation": record["isolation"],
            }
        )
    if {r["isolation"] for r in runs} != {isolation}:
        raise SystemExit(f"asked for isolation {isolation}, the runs record {[r['isolation'] for r in runs]}")
    return {"isolation": isolation, "repeat": repeat, "wall_s": wall, "runs": runs}


def summarise(ablations: list[dict[str, Any]]) -> dict[str, Any]:
    """Per isolation: medians over repeats of the whole wall, the runs' work and their start-up."""
    out: dict[str, Any] = {}
    for iso in ISOLATIONS:
        mine = [a for a in ablations if a["isolation"] == iso]
        if not mine:
            continue
        out[iso] = {
            "repeats": len(mine),
            "runs": len(mine[0]["runs"]),
            "wall_s": statistics.median(a["wall_s"] for a in mine),
            "work_s": statistics.median(sum(r["work_s"] for r in a["runs"]) for a in mine),
            "startup_s_per_run": statistics.median(r["startup_s"] for a in mine for r in a["runs"]),
            "outside_runs_s": statistics.median(
                a["wall_s"] - sum(r["elapsed_s"] for r in a["runs"]) for a in mine
            ),
        }
    if set(out) == set(ISOLATIONS):
        # Paired by repeat: both isolations of repeat r ran next to each other.
        ratios = [
            e["wall_s"] / f["wall_s"]
            for e in ablations
            for f in ablations
            if e["isolation"] == "exec" and f["isolation"] == "fork" and e["repeat"] == f["repeat"]
        ]
        exec_ = out["exec"]
        out["speedup"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        # The most any isolation could give: every run's start-up and the runner's own time gone.
        out["bound_without_startup"] = exec_["wall_s"] / exec_["work_s"]
    return out


def markdown(result: dict[str, Any]) -> str:
    s, env = result["summary"], result["environment"]
    lines = [
        "# The ablation runner: a fresh interpreter per run (exec) against forked runs (fork)",
        "",
        f"`{' '.join(result['command_shown'])}`; {env['cpus']} CPUs, load before {env['load_before']}, "
        f"commit {env['commit']}, torch_xla {env['versions']['torch_xla']}.",
        "",
        "| isolation | repeats | runs | whole ablation (s) | the runs' own work (s) | start-up per run (s) "
        "| runner outside the runs (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for iso in ISOLATIONS:
        if iso in s:
            row = s[iso]
            lines.append(
                f"| {iso} | {row['repeats']} | {row['runs']} | {row['wall_s']:.0f} | {row['work_s']:.0f} "
                f"| {row['startup_s_per_run']:.1f} | {row['outside_runs_s']:.1f} |"
            )
    if "speedup" in s:
        sp = s["speedup"]
        lines += [
            "",
            f"fork against exec, the whole ablation: {sp['median']:.2f}x "
            f"(min {sp['min']:.2f}x, max {sp['max']:.2f}x, paired by repeat). With no start-up at all "
            f"(every second outside the runs' own work gone), exec's ablation would be at most "
            f"{s['bound_without_startup']:.2f}x faster.",
            "",
            "Own work: the workload's `total_s` (training, warm-up and compilations included) plus "
            "`eval_s`; start-up per run: the run's elapsed time less its own work (interpreter, imports, "
            "data, model, runtime start), median over runs.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/bench-isolation")
    parser.add_argument("--repeats", type=int, default=1, help="ablations per isolation (default: 1)")
    parser.add_argument("--order", default=MAIN_ORDER, help="add-one order (default: the main job's)")
    parser.add_argument("--no-eager", action="store_true", help="leave out the eager reference row")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (default: 900)")
    parser.add_argument("args", nargs="*", help="after --: the example's arguments (default: the main job's)")
    opts = parser.parse_args(argv)
    if opts.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {opts.repeats}")
    os.makedirs(os.path.join(opts.out, "logs"), exist_ok=True)
    env = environment()
    ablations = []
    for repeat in range(1, opts.repeats + 1):
        order = ISOLATIONS if repeat % 2 else ISOLATIONS[::-1]
        for iso in order:
            print(f"repeat {repeat}: isolation {iso} ...", flush=True)
            ablations.append(run_one(iso, repeat, opts))
            print(f"  {ablations[-1]['wall_s']:.0f} s", flush=True)
    shown = command("ISOLATION", "OUT", opts.order, not opts.no_eager, opts.timeout, opts.args or MAIN_ARGS)
    result = {
        "command_shown": ["python", *shown[1:]],
        "argv": sys.argv,
        "environment": env,
        "ablations": ablations,
        "summary": summarise(ablations),
    }
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result)
    with open(os.path.join(opts.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
