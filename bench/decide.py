"""The main job decided two ways, side by side: today's runner (order statistics, 6 repeats) and `make ablate`.

    python -m bench.decide --out results/bench-decide        # both, one after the other (about 30 min, estimated, quiet)
    python -m bench.decide --only new --out /tmp/decide      # the new main job alone
    python -m bench.decide --only old --new-from results/nlp-ablation --new-wall 1500   # old, beside a finished `make ablate`

Runs the Makefile's main job (``ABLATE_PLAN``, ``ABLATE_OPTS`` and
``ABLATE_ARGS``: the example unchanged, rounds until decided, the budget) with
this checkout, and the same plan and script arguments with the runner of commit
``--old-commit`` (the one before the rounds, the session's measurement and the
Student-t intervals: the example follows the workload contract, order
statistics of 6 paired repeats; ``git archive`` of that commit into
``OUT/old-src``, run from there). Each into a fresh folder. Writes
``results.md`` (the wall time of each, both tables, and the verdict of each row
side by side) and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from bench.run import REPO, environment

OLD_COMMIT = "93a8ceb"  # the runner of issue 22's report: order statistics, one repeat by default
OLD_REPEATS = ["--repeats", "6", "--timeout", "3600"]
RUNNERS = ("old", "new")


def makefile_words(name: str) -> list[str]:
    """The words of a ``NAME ?= ...`` assignment in the Makefile (continued lines joined)."""
    with open(os.path.join(REPO, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith(f"{name} ?="):
            return line.split("?=", 1)[1].split()
    raise SystemExit(f"no {name} in the Makefile")


def command(runner: str, out: str) -> list[str]:
    """``xlapipe ablate`` of the main job: as the Makefile runs it (new), or with 6 repeats (old)."""
    opts = makefile_words("ABLATE_OPTS") if runner == "new" else OLD_REPEATS
    return [
        sys.executable,
        "-m",
        "xlapipe.cli",
        "ablate",
        "examples/nlp_example.py",
        "--out",
        out,
        *makefile_words("ABLATE_PLAN"),
        *opts,
        "--no-progress",
        "--",
        *makefile_words("ABLATE_ARGS"),
    ]


def old_source(out: str, commit: str) -> str:
    """The repository at ``commit``, unpacked into ``out/old-src``."""
    src = os.path.join(out, "old-src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
    return src


def run(runner: str, opts: argparse.Namespace) -> dict[str, Any]:
    """One whole ablation: its wall time and each row's verdict (from its ablation.csv)."""
    folder = os.path.abspath(os.path.join(opts.out, runner))
    shutil.rmtree(folder, ignore_errors=True)  # a fresh folder: nothing resumed
    cwd = REPO if runner == "new" else old_source(opts.out, opts.old_commit)
    env = {**os.environ, "PYTHONPATH": cwd}
    cmd = command(runner, folder)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    with open(os.path.join(opts.out, f"{runner}.log"), "w") as log:
        log.write(proc.stdout + proc.stderr)
    if not os.path.exists(os.path.join(folder, "ablation.csv")):
        raise SystemExit(f"{' '.join(cmd)} wrote no table (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return collected(runner, folder, ["python", *cmd[1:]], wall, proc.returncode)


def collected(runner: str, folder: str, cmd: list[str], wall: float, code: int | None) -> dict[str, Any]:
    """A finished ablation in ``folder``: its wall time and each row's verdict (from its ablation.csv)."""
    with open(os.path.join(folder, "ablation.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(folder, "ablation.md")) as f:
        table = f.read().split("\n## ")[0]
    return {
        "runner": runner,
        "command": cmd,
        "wall_s": wall,
        "exit": code,
        "runs": sum(int(r["runs_ok"]) + int(r["runs_failed"]) for r in rows),
        "verdicts": {r["variant"]: r["verdict"] for r in rows},
        "table": table,
    }


def verdict_word(text: str) -> str:
    """``faster``, ``slower``, ``no detectable difference``, ``undecided`` or ``reference``."""
    return text.split(" (")[0] if text else "reference"


def markdown(result: dict[str, Any]) -> str:
    env, by = result["environment"], {r["runner"]: r for r in result["ablations"]}
    lines = [
        "# The main job decided: today's runner (6 repeats) and `make ablate`, side by side",
        "",
        f"{env['cpus']} CPUs ({env['machine']}), Python {env['python']}, torch_xla "
        f"{env['versions']['torch_xla']}, commit {env['commit']}, load before {env['load_before']}.",
        "",
        "| runner | command | runs | wall time |",
        "|---|---|---|---|",
    ]
    for name in RUNNERS:
        if name in by:
            r = by[name]
            lines.append(
                f"| {name} | `{' '.join(r['command'])}` | {r['runs']} | {r['wall_s'] / 60:.1f} min |"
            )
    if set(by) == set(RUNNERS):
        lines += ["", "| variant | old (6 repeats) | new | same decision |", "|---|---|---|---|"]
        for name, old in by["old"]["verdicts"].items():
            new = by["new"]["verdicts"].get(name, "")
            same = verdict_word(old) == verdict_word(new)
            lines.append(
                f"| {name} | {old or 'reference'} | {new or 'reference'} | {'yes' if same else '**no**'} |"
            )
    for name in RUNNERS:
        if name in by:
            lines += ["", f"## {name}", "", by[name]["table"].strip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/bench-decide")
    parser.add_argument("--old-commit", default=OLD_COMMIT, help="today's runner (default: %(default)s)")
    parser.add_argument("--only", choices=RUNNERS, help="run one of the two")
    parser.add_argument(
        "--new-from",
        metavar="FOLDER",
        help="take the new runner's table from a finished `make ablate` (its --out folder) instead of running it",
    )
    parser.add_argument("--new-wall", type=float, metavar="SECONDS", help="that `make ablate`'s wall time")
    opts = parser.parse_args(argv)
    if bool(opts.new_from) != (opts.new_wall is not None):
        parser.error(
            "--new-from and --new-wall go together: the folder of a finished `make ablate` and its wall time"
        )
    os.makedirs(opts.out, exist_ok=True)
    env = environment()
    ablations = (
        [collected("new", opts.new_from, ["make", "ablate"], opts.new_wall, None)] if opts.new_from else []
    )
    for runner in [opts.only] if opts.only else RUNNERS:
        if opts.new_from and runner == "new":
            continue  # taken from the finished `make ablate`
        print(f"{runner} runner ...", flush=True)
        ablations.append(run(runner, opts))
        print(f"  {ablations[-1]['wall_s'] / 60:.1f} min", flush=True)
    result = {"argv": sys.argv, "environment": env, "ablations": ablations}
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result)
    with open(os.path.join(opts.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
