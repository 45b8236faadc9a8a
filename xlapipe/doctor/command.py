"""``xlapipe doctor SCRIPT [--steps N] [--json FILE] [--out DIR] [-- script args]``: the command line."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from typing import Any


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The doctor's options (the parser of ``xlapipe doctor``)."""
    p.add_argument("script", help="the training script, run as `python SCRIPT ARGS` would run it")
    p.add_argument(
        "--steps", type=_positive(int), default=20, help="steps to run, then stop (default: %(default)s)"
    )
    p.add_argument(
        "--warmup",
        type=_positive(int),
        default=3,
        help="first steps left out of the findings (default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=600.0,
        help="seconds before the script is stopped (default: %(default)s)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the diagnosis as JSON to FILE")
    p.add_argument(
        "--out", metavar="DIR", help="write report.md, report.json and the suggested pipeline to DIR"
    )
    p.add_argument(
        "--overhead",
        action="store_true",
        help="also run the script with the step counter only, and state the doctor's overhead",
    )
    p.add_argument("--keep-trace", metavar="DIR", help="copy torch_xla's raw traces and graphs to DIR")
    p.add_argument("--python", default=sys.executable, help="interpreter for the script (default: this one)")


def run(opts: argparse.Namespace, rest: list[str]) -> int:
    """Diagnose, print the summary, write what was asked; 0 when the script made its steps, 1 when not."""
    from xlapipe.doctor.diagnose import check_script, diagnose
    from xlapipe.doctor.report import summary, write_folder, write_json

    check_script(opts.script)

    for flag, path in (("--json", opts.json), ("--out", opts.out)):
        if path and flag == "--json" and os.path.isdir(path):
            raise ValueError(f"--json {path!r} is a folder; give a file name")
        if path and flag == "--json" and not os.path.isdir(os.path.dirname(path) or "."):
            raise ValueError(
                f"--json {path!r}: no folder {os.path.dirname(path)!r} to write it in; create it first "
                "or give another path"
            )
        if path and flag == "--out" and os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"--out {path!r} is a file; give a folder (it is created if missing)")
    print(f"xlapipe doctor: running {opts.script} for {opts.steps} steps...", file=sys.stderr, flush=True)
    try:
        d = diagnose(
            opts.script,
            rest,
            steps=opts.steps,
            warmup=opts.warmup,
            timeout=opts.timeout,
            python=opts.python,
            overhead=opts.overhead,
            keep=opts.keep_trace,
        )
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        print(
            f"xlapipe doctor: interrupted by {signal.Signals(signum).name}; the script was stopped "
            "(its whole process group) and the run's files removed",
            file=sys.stderr,
        )
        return 128 + signum
    print(summary(d))
    written = []
    if opts.json:
        write_json(d, opts.json)
        written.append(opts.json)
    if opts.out:
        written += [os.path.join(opts.out, name) for name in write_folder(d, opts.out)]
    if written:
        print(f"\nwrote {', '.join(written)}")
    return 0 if d.ok else 1
