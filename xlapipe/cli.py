"""The ``xlapipe`` command.

    xlapipe ablate SCRIPT [options] -- [script args]   measure each practice's effect
    xlapipe report OUT                                  redo the tables and plot of OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from xlapipe.ablation.variants import MODES


def _json(value: str, what: str) -> Any:
    """JSON text, or a path to a file holding it."""
    text = value
    if not value.lstrip().startswith(("[", "{")) and os.path.isfile(value):
        with open(value) as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"xlapipe: {what} is not valid JSON ({error}); give JSON text or a file holding it")


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xlapipe", description="PyTorch/XLA practices as measurable transforms.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ab = sub.add_parser(
        "ablate", help="run a workload under pipeline variants, each in a fresh process",
        description="Run a workload script (or MODULE:FUNCTION) under variants of its pipeline, "
                    "each in a fresh process; arguments after -- go to the script. See docs/ablation.md.",
    )
    ab.add_argument("target", help="workload script following the contract, or MODULE:FUNCTION")
    ab.add_argument("--mode", choices=MODES, default="leave-one-out",
                    help="which variants to run (default: %(default)s)")
    ab.add_argument("--pipeline", help="full pipeline as JSON (or a file); default: the script's --print-pipeline")
    ab.add_argument("--variants", help="explicit mode: JSON list of pipelines or {name, pipeline} (or a file)")
    ab.add_argument("--baseline", help="comma-separated transforms of the baseline variant (default: none)")
    ab.add_argument("--reference", help="compare against this variant instead of the baseline")
    ab.add_argument("--factors", help="factorial mode: comma-separated transforms to switch on and off")
    ab.add_argument("--order", help="add-one mode: comma-separated order in which to add transforms")
    ab.add_argument("--independent", action="store_true",
                    help="add-one mode: each step is the baseline plus one transform (default: cumulative)")
    ab.add_argument("--repeats", type=int, default=1, help="runs per variant, interleaved (default: 1)")
    ab.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (default: 1800)")
    ab.add_argument("--out", default="results/ablation", help="output folder (default: %(default)s)")
    ab.add_argument("--figure", default="epoch_s", help="report key compared (default: %(default)s)")
    ab.add_argument("--kwargs", help="function targets: JSON object of keyword arguments")
    ab.add_argument("--no-retry-failed", action="store_true",
                    help="on resume, keep recorded errors and timeouts instead of running them again")
    ab.add_argument("--no-progress", action="store_true", help="no progress bar")
    ab.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    ab.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first: it registers transforms of your own (repeatable)")

    rep = sub.add_parser("report", help="write the tables and plot again from OUT/results.jsonl")
    rep.add_argument("out", help="an ablation's output folder (or its results.jsonl)")
    rep.add_argument("--figure", default="epoch_s", help="report key compared (default: %(default)s)")
    return parser


def _ablate(opts: argparse.Namespace, rest: list[str]) -> int:
    from xlapipe.ablation import ablate

    results = ablate(
        opts.target,
        pipeline=None if opts.pipeline is None else _json(opts.pipeline, "--pipeline"),
        mode=opts.mode,
        args=rest,
        kwargs=None if opts.kwargs is None else _json(opts.kwargs, "--kwargs"),
        out=opts.out,
        repeats=opts.repeats,
        timeout=opts.timeout,
        baseline=_names(opts.baseline),
        reference=opts.reference,
        factors=_names(opts.factors),
        order=_names(opts.order),
        cumulative=not opts.independent,
        variants=None if opts.variants is None else _json(opts.variants, "--variants"),
        figure=opts.figure,
        retry_failed=not opts.no_retry_failed,
        progress=not opts.no_progress,
        python=opts.python,
        imports=opts.imports,
    )
    print()
    print(results.table())
    print(f"wrote {opts.out}/results.jsonl, ablation.md, ablation.csv, ablation.png")
    return 0 if results.ok else 1


def _report(opts: argparse.Namespace) -> int:
    from xlapipe.ablation import Results

    results = Results.load(opts.out, figure=opts.figure)
    paths = results.write()
    print(results.table())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``xlapipe`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    parser = _parser()
    opts = parser.parse_args(argv)
    if rest and opts.command != "ablate":
        parser.error(f"arguments after -- are only for 'xlapipe ablate', got {rest}")
    from xlapipe import runtime

    runtime.ensure_pjrt_device()
    try:
        if opts.command == "ablate":
            return _ablate(opts, rest)
        return _report(opts)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"xlapipe {opts.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
