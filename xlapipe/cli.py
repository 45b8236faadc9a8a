"""The ``xlapipe`` command.

    xlapipe ablate SCRIPT [options] -- [script args]   measure each practice's effect
    xlapipe report OUT                                  redo the tables and plots of OUT
    xlapipe doctor SCRIPT [options] -- [script args]   say what is slow in a script, where, and the fix

Bad input gives one ``xlapipe COMMAND: error: ...`` line and exit status 2; an
interrupted ablation (Ctrl-C, SIGTERM) exits 130 or 143 after killing the run
in flight, which is not recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from xlapipe.ablation.processes import ISOLATIONS
from xlapipe.ablation.variants import DESIGNS, MODES


def _json(value: str, what: str) -> Any:
    """JSON text, or a path to a file holding it."""
    text = value
    looks_like_json = value.lstrip().startswith(("[", "{", '"')) or value.strip() in ("null", "true", "false")
    if not looks_like_json and os.path.exists(value):
        if os.path.isdir(value):
            raise ValueError(f"{what} {value!r} is a folder; give JSON text or a file holding it")
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{what}: cannot read {value!r} ({error})") from None
        what = f"{what} (file {value})"
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        hint = "" if looks_like_json or os.path.exists(value) else f" and there is no file {value!r}"
        raise ValueError(
            f"{what} is not valid JSON ({error}){hint}; give JSON text or a file holding it"
        ) from None


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got {text!r}")
    return value


def _fraction(text: str) -> float:
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a fraction or percentage: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a non-negative, finite fraction, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_judging(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judging (intervals, verdicts, the recommendation)")
    g.add_argument("--figure", default="epoch_s", help="report key compared (default: %(default)s)")
    g.add_argument(
        "--confidence",
        type=_fraction,
        default=0.95,
        help="coverage of each speed-up's interval (default: %(default)s; 95%% needs 6 paired repeats)",
    )
    g.add_argument(
        "--resolution",
        type=_fraction,
        default=0.05,
        help="an interval holding 1.0 that reaches no further than this from it counts as "
        "resolved: no difference larger than this (default: 0.05, i.e. ±5%%)",
    )
    g.add_argument(
        "--target-metric",
        default=None,
        metavar="VALUE",
        help="time to reach this metric from the runs' metric_history: 0.8 (at least) or '<=0.3'",
    )
    g.add_argument(
        "--tolerance",
        type=_fraction,
        default=0.02,
        help="the recommended pipeline keeps the reference's final loss and metric within "
        "this relative tolerance (default: 0.02, i.e. 2%%)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xlapipe", description="PyTorch/XLA practices as measurable transforms."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ab = sub.add_parser(
        "ablate",
        help="run a workload under pipeline variants, each in a fresh process",
        description="Run a workload script (or MODULE:FUNCTION) under variants of its pipeline, "
        "each in a fresh process; arguments after -- go to the script. See docs/ablation.md.",
    )
    ab.add_argument("target", help="workload script following the contract, or MODULE:FUNCTION")
    ab.add_argument(
        "--mode", choices=MODES, default="leave-one-out", help="which variants to run (default: %(default)s)"
    )
    ab.add_argument(
        "--pipeline", help="full pipeline as JSON (or a file); default: the script's --print-pipeline"
    )
    ab.add_argument(
        "--variants", help="explicit mode: JSON list of pipelines or {name, pipeline} (or a file)"
    )
    ab.add_argument("--baseline", help="comma-separated transforms of the baseline variant (default: none)")
    ab.add_argument(
        "--eager-reference",
        action="store_true",
        help="also run eager PyTorch on the CPU (the empty pipeline) as an extra reference row",
    )
    ab.add_argument("--reference", help="compare against this variant instead of the baseline")
    ab.add_argument("--factors", help="factorial mode: comma-separated transforms to switch on and off")
    ab.add_argument(
        "--design",
        choices=DESIGNS,
        default=None,
        help="factorial mode: every subset (full), a resolution V fraction (fractional), or "
        "fractional above five factors (auto, the default)",
    )
    ab.add_argument("--order", help="add-one mode: comma-separated order in which to add transforms")
    ab.add_argument(
        "--independent",
        action="store_true",
        help="add-one mode: each step is the baseline plus one transform (default: cumulative)",
    )
    ab.add_argument(
        "--repeats", type=_positive_int, default=1, help="runs per variant, interleaved (default: 1)"
    )
    ab.add_argument(
        "--until-resolved",
        action="store_true",
        help="after --repeats, add interleaved rounds of the reference and the unresolved "
        "variants until each is resolved or --budget is spent",
    )
    ab.add_argument(
        "--budget",
        default=None,
        metavar="DURATION",
        help="stop starting runs after this long, e.g. 30m, 1h30m, 900 (seconds)",
    )
    ab.add_argument("--timeout", type=_seconds, default=1800.0, help="seconds per run (default: 1800)")
    ab.add_argument("--out", default="results/ablation", help="output folder (default: %(default)s)")
    ab.add_argument("--kwargs", help="function targets: JSON object of keyword arguments (or a file)")
    ab.add_argument(
        "--isolation",
        choices=ISOLATIONS,
        default="fork",
        help="fork: each run forked from a warm process that imported the workload but never "
        "started the XLA runtime (default); exec: a fresh interpreter per run",
    )
    ab.add_argument(
        "--no-retry-failed",
        action="store_true",
        help="on resume, keep recorded errors and timeouts instead of running them again",
    )
    ab.add_argument("--no-progress", action="store_true", help="no progress bar")
    ab.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    ab.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: it registers transforms of your own (repeatable)",
    )
    _add_judging(ab)

    rep = sub.add_parser("report", help="write the tables and plots again from OUT/results.jsonl")
    rep.add_argument("out", help="an ablation's output folder (or its results.jsonl)")
    _add_judging(rep)

    from xlapipe.doctor.command import add_arguments

    add_arguments(
        sub.add_parser(
            "doctor",
            help="run a training script for a few steps and say what is slow, where, and the fix",
            description="Run a training script (plain torch_xla or xlapipe) unchanged, in a fresh "
            "process, for at most --steps steps; arguments after -- go to the script. See docs/doctor.md.",
        )
    )
    return parser


def _out_folder(value: str) -> str:
    if os.path.exists(value) and not os.path.isdir(value):
        raise ValueError(f"--out {value!r} is a file; give a folder (it is created if missing)")
    parent = os.path.dirname(os.path.abspath(value))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise ValueError(f"--out {value!r} is inside {parent!r}, which is a file; give a folder")
    return value


def _kwargs(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    kwargs = _json(value, "--kwargs")
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"--kwargs must be a JSON object of keyword arguments, e.g. '{{\"max_steps\": 8}}'; "
            f"got {type(kwargs).__name__}"
        )
    return kwargs


def _ablate(opts: argparse.Namespace, rest: list[str]) -> int:
    from xlapipe.ablation import ablate

    out = _out_folder(opts.out)
    results = ablate(
        opts.target,
        pipeline=None if opts.pipeline is None else _json(opts.pipeline, "--pipeline"),
        mode=opts.mode,
        args=rest,
        kwargs=_kwargs(opts.kwargs),
        out=out,
        repeats=opts.repeats,
        timeout=opts.timeout,
        baseline=_names(opts.baseline),
        reference=opts.reference,
        factors=_names(opts.factors),
        design=opts.design,
        order=_names(opts.order),
        cumulative=not opts.independent,
        variants=None if opts.variants is None else _json(opts.variants, "--variants"),
        eager_reference=opts.eager_reference,
        figure=opts.figure,
        confidence=opts.confidence,
        resolution=opts.resolution,
        until_resolved=opts.until_resolved,
        budget=opts.budget,
        target_metric=opts.target_metric,
        tolerance=opts.tolerance,
        isolation=opts.isolation,
        retry_failed=not opts.no_retry_failed,
        progress=not opts.no_progress,
        python=opts.python,
        imports=opts.imports,
    )
    print()
    print(results.table())
    from xlapipe.ablation import report
    from xlapipe.ablation.results import RESULTS_FILE

    written = [RESULTS_FILE, report.TABLE_FILE, report.CSV_FILE, report.PLOT_FILE]
    written += [
        name
        for name in (report.PHASES_FILE, report.RECOMMENDED_PY, report.RECOMMENDED_JSON)
        if os.path.exists(os.path.join(out, name))  # write_all removes the ones it did not write
    ]
    print(f"wrote {out}/: {', '.join(written)}")
    return 0 if results.ok else 1


def _report(opts: argparse.Namespace) -> int:
    from xlapipe.ablation import Results

    results = Results.load(
        opts.out,
        figure=opts.figure,
        confidence=opts.confidence,
        resolution=opts.resolution,
        target=opts.target_metric,
        tolerance=opts.tolerance,
    )
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
        argv, rest = argv[:at], argv[at + 1 :]
    parser = _parser()
    opts = parser.parse_args(argv)
    if rest and opts.command not in ("ablate", "doctor"):
        parser.error(f"arguments after -- are only for 'xlapipe ablate' and 'xlapipe doctor', got {rest}")
    from xlapipe import runtime

    runtime.ensure_pjrt_device()
    try:
        if opts.command == "ablate":
            return _ablate(opts, rest)
        if opts.command == "doctor":
            from xlapipe.doctor.command import run

            return run(opts, rest)
        return _report(opts)
    except KeyboardInterrupt as stop:
        from xlapipe.ablation.processes import Interrupted

        signum = stop.signum if isinstance(stop, Interrupted) else 2
        name = "SIGTERM" if signum == 15 else "Ctrl-C (SIGINT)" if signum == 2 else f"signal {signum}"
        print(
            f"xlapipe {opts.command}: interrupted by {name}: the run in flight was killed and not "
            "recorded; run the same command again to resume",
            file=sys.stderr,
        )
        return 128 + signum
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as error:
        print(f"xlapipe {opts.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
