"""The doctor's own cost: each script of its corpus run plain and under ``xlapipe doctor``, side by side.

    .venv/bin/python -m bench.doctor_cost --out results/doctor-cost       # make bench-doctor

For each script of ``tests/doctor_scripts`` (the planted faults and their
clean controls; ``--only`` picks some), both through xlapipe's one runner
(:mod:`xlapipe.child_process`), one right after the other, their order
swapped on every other script and repeat:

- **plain**: ``python SCRIPT`` to its end; its wall time;
- **under the doctor**: ``xlapipe doctor SCRIPT --steps 1000`` (more steps than
  any script makes, so the script also runs to its end: the same work): the
  script's own wall time under the probe (the diagnosis's ``elapsed_s``) and
  the whole command's. The difference is the doctor's start-up and analysis.

Reported per script: the ratio of the script's time under the doctor to its
plain time, and the seconds outside the script; then the median and worst of
each, against issue 30's targets (at most 1.5x, under 10 s). Writes
``results.json`` and ``results.md`` to ``--out``. These scripts are tiny: an
interpreter's start and torch's import are most of a plain run, compilation
most of the rest; on a real model the probe's share is smaller.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from xlapipe import child_process

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "doctor_scripts"
# Not a training run to its end: shared code, a script that hangs on purpose, one that crashes.
LEFT_OUT = {"tiny.py", "hang.py", "crash.py"}
RATIO_TARGET, OUTSIDE_TARGET_S = 1.5, 10.0


def corpus(only: list[str] | None = None) -> list[str]:
    """The scripts measured, by name."""
    names = sorted(p.name for p in SCRIPTS.glob("*.py") if p.name not in LEFT_OUT)
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"no script {', '.join(unknown)} in {SCRIPTS} (have: {', '.join(names)})")
        names = [n for n in names if n in only]
    return names


def plain(name: str, out: Path, timeout: float) -> dict[str, Any]:
    done = child_process.run(
        [sys.executable, name], log=out / "logs" / f"{name}.plain.log", cwd=SCRIPTS, limit=timeout
    )
    return {"status": done.status, "returncode": done.returncode, "wall_s": done.elapsed_s}


def doctored(name: str, out: Path, timeout: float) -> dict[str, Any]:
    report = out / "logs" / f"{name}.doctor.json"
    cmd = [sys.executable, "-m", "xlapipe.cli", "doctor", name, "--steps", "1000", "--json", str(report)]
    cmd += ["--timeout", str(timeout)]
    done = child_process.run(cmd, log=out / "logs" / f"{name}.doctor.log", cwd=SCRIPTS, limit=timeout + 120)
    found = json.loads(report.read_text()) if report.exists() else {}
    script_s = found.get("elapsed_s")
    return {
        "status": found.get("status", done.status),
        "steps": found.get("steps"),
        "findings": [f["kind"] for f in found.get("findings", [])],
        "wall_s": done.elapsed_s,
        "script_s": script_s,
        "outside_s": None if script_s is None else done.elapsed_s - script_s,
    }


def measure(names: list[str], repeats: int, out: Path, timeout: float) -> list[dict[str, Any]]:
    runs = []
    for repeat in range(repeats):
        for i, name in enumerate(names):
            first_plain = (i + repeat) % 2 == 0
            order = ("plain", "doctor") if first_plain else ("doctor", "plain")
            got = {kind: (plain if kind == "plain" else doctored)(name, out, timeout) for kind in order}
            p, d = got["plain"], got["doctor"]
            ok = p["status"] == "ended" and d["script_s"] is not None
            runs.append(
                {
                    "script": name,
                    "repeat": repeat,
                    "order": list(order),
                    "plain": p,
                    "doctor": d,
                    "ratio": d["script_s"] / p["wall_s"] if ok else None,
                }
            )
            shown = f"{runs[-1]['ratio']:.2f}x" if ok else f"not measured ({p['status']}, {d['status']})"
            print(f"[{repeat + 1}/{repeats}] {name}: {shown}", flush=True)
    return runs


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per script the median over repeats; then the median and the worst over scripts."""
    per: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["script"] for r in runs):
        mine = [r for r in runs if r["script"] == name and r["ratio"] is not None]
        if not mine:
            per[name] = {"measured": False}
            continue
        per[name] = {
            "measured": True,
            "plain_s": statistics.median(r["plain"]["wall_s"] for r in mine),
            "script_s": statistics.median(r["doctor"]["script_s"] for r in mine),
            "ratio": statistics.median(r["ratio"] for r in mine),
            "outside_s": statistics.median(r["doctor"]["outside_s"] for r in mine),
        }
    measured = [s for s in per.values() if s["measured"]]
    ratios = [s["ratio"] for s in measured]
    outside = [s["outside_s"] for s in measured]
    return {
        "scripts": per,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_worst": max(ratios, default=None),
        "outside_s_median": statistics.median(outside) if outside else None,
        "outside_s_worst": max(outside, default=None),
        "ratio_target": RATIO_TARGET,
        "outside_target_s": OUTSIDE_TARGET_S,
        "unmeasured": sorted(n for n, s in per.items() if not s["measured"]),
    }


def markdown(summary: dict[str, Any], command: str, environment: dict[str, Any]) -> str:
    lines = [
        f"`{command}`, {environment['date']}, {environment['cpus']} CPUs, {environment['python']}",
        "",
        "| script | plain (s) | under the doctor (s) | ratio | doctor outside the script (s) |",
        "|---|---|---|---|---|",
    ]
    for name, s in summary["scripts"].items():
        if s["measured"]:
            lines.append(
                f"| {name} | {s['plain_s']:.1f} | {s['script_s']:.1f} | {s['ratio']:.2f}x | {s['outside_s']:.1f} |"
            )
        else:
            lines.append(f"| {name} | not measured (see results.json) | | | |")
    if summary["ratio_median"] is not None:
        lines += [
            "",
            f"Ratio: median {summary['ratio_median']:.2f}x, worst {summary['ratio_worst']:.2f}x "
            f"(target: at most {RATIO_TARGET:g}x). Outside the script: median "
            f"{summary['outside_s_median']:.1f} s, worst {summary['outside_s_worst']:.1f} s "
            f"(target: under {OUTSIDE_TARGET_S:g} s).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/doctor-cost")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", help="comma-separated script names (default: every script)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    opts = parser.parse_args(argv)
    if opts.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {opts.repeats}")
    out = Path(opts.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    names = corpus(opts.only.split(",") if opts.only else None)
    runs = measure(names, opts.repeats, out, opts.timeout)
    summary = summarise(runs)
    environment = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_1min": os.getloadavg()[0],
    }
    command = " ".join(["python -m bench.doctor_cost", *(argv if argv is not None else sys.argv[1:])])
    (out / "results.json").write_text(
        json.dumps({"runs": runs, "summary": summary, "environment": environment}, indent=2)
    )
    (out / "results.md").write_text(markdown(summary, command, environment))
    print(markdown(summary, command, environment))
    return 0


if __name__ == "__main__":
    sys.exit(main())
