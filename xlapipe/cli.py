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


def _pipeline(value: str) -> list[Any]:
    """``--pipeline``: a JSON list of transforms (or a file holding one)."""
    pipeline = _json(value, "--pipeline")
    if not isinstance(pipeline, list):
        shown = "null" if pipeline is None else json.dumps(pipeline)
        hint = f'; e.g. [{{"name": {json.dumps(pipeline)}}}]' if isinstance(pipeline, str) else ""
        raise ValueError(
            f'--pipeline must be a JSON list of {{"name": ..., "params": {{...}}}} objects, '
            f"got {type(pipeline).__name__ if pipeline is not None else 'null'} {shown}{hint}"
        )
    return pipeline


def _seconds(text: str) -> float:
    from xlapipe.ablation.options import positive_seconds

    try:
        return positive_seconds(text, "the time limit")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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


JUDGING_FLAGS = ("figure", "confidence", "resolution", "target_metric", "tolerance")


def _add_judging(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judging (intervals, verdicts, the recommendation)")
    g.add_argument("--figure", help="report key compared (default: epoch_s)")
    g.add_argument(
        "--confidence",
        type=_fraction,
        help="the confidence a variant's intervals hold over all its looks, one per round (default: 0.95)",
    )
    g.add_argument(
        "--resolution",
        type=_fraction,
        help="an interval holding 1.0 that reaches no further than this from it counts as "
        "resolved: no difference larger than this (default: 0.05, i.e. ±5%%)",
    )
    g.add_argument(
        "--target-metric",
        metavar="VALUE",
        help="time to reach this metric from the runs' metric_history: 0.8 (at least) or '<=0.3'",
    )
    g.add_argument(
        "--tolerance",
        type=_fraction,
        help="the recommended pipeline keeps the reference's final loss and metric within "
        "this relative tolerance (default: 0.02, i.e. 2%%)",
    )


def _given(opts: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    return {n: getattr(opts, n) for n in names if getattr(opts, n) is not None}


def _parser(doctor_only: bool = False) -> argparse.ArgumentParser:
    """The command line; ``doctor_only``: the doctor's alone (``xlapipe doctor`` loads no ablation module)."""
    parser = argparse.ArgumentParser(
        prog="xlapipe", description="PyTorch/XLA practices as measurable transforms."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if doctor_only:
        _add_doctor(sub)
        return parser
    from xlapipe.ablation.variants import DESIGNS, MODES

    ab = sub.add_parser(
        "ablate",
        help="run a workload under pipeline variants, each in a fresh process",
        description="Run a workload script (or MODULE:FUNCTION) under variants of its pipeline, "
        "each in a fresh process; arguments after -- go to the script. See docs/ablation.md.",
    )
    ab.add_argument(
        "target",
        help="a training script (run unchanged: each variant replaces the pipeline it trains with "
        "in xp.session, and the session measures it), or MODULE:FUNCTION",
    )
    v = ab.add_argument_group("variants")
    v.add_argument(
        "--mode", choices=MODES, default="leave-one-out", help="which variants to run (default: %(default)s)"
    )
    v.add_argument(
        "--pipeline",
        help="full pipeline as a JSON list (or a file); default: the one the script trains with",
    )
    v.add_argument("--variants", help="explicit mode: JSON list of pipelines or {name, pipeline} (or a file)")
    v.add_argument("--baseline", help="comma-separated transforms of the baseline variant (default: none)")
    v.add_argument(
        "--eager-reference",
        action="store_true",
        help="also run eager PyTorch on the CPU (the empty pipeline) as an extra reference row",
    )
    v.add_argument(
        "--aa",
        action="store_true",
        help="also run the last row a second time (an A/A pair): the noise floor, which must come out "
        "'no detectable difference'",
    )
    v.add_argument("--reference", help="compare against this variant instead of the baseline")
    v.add_argument("--factors", help="factorial mode: comma-separated transforms to switch on and off")
    v.add_argument(
        "--design",
        choices=DESIGNS,
        default=None,
        help="factorial mode: every subset (full), a resolution V fraction (fractional), or "
        "fractional above five factors (auto, the default)",
    )
    v.add_argument("--order", help="add-one mode: comma-separated order in which to add transforms")
    v.add_argument(
        "--independent",
        action="store_true",
        help="add-one mode: each step is the baseline plus one transform (default: cumulative)",
    )
    v.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: it registers transforms of your own (repeatable)",
    )
    r = ab.add_argument_group("rounds")
    r.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="rounds every variant gets, interleaved (default: %(default)s)",
    )
    r.add_argument(
        "--until-resolved",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after --repeats, add rounds of the reference and the unresolved variants until each is "
        "resolved, --max-rounds or --budget (default: on; --no-until-resolved runs --repeats only)",
    )
    r.add_argument(
        "--max-rounds", type=_positive_int, default=6, help="the most rounds a variant gets (default: 6)"
    )
    r.add_argument(
        "--budget",
        metavar="DURATION",
        help="stop starting runs after this long, e.g. 30m, 1h30m, 900 (seconds)",
    )
    runs = ab.add_argument_group("runs")
    runs.add_argument(
        "--timeout",
        type=_seconds,
        help="seconds per run (default: sized from the work: a variant's first run up to an hour, "
        "later ones up to four times its longest)",
    )
    runs.add_argument(
        "--contract",
        action="store_true",
        help="the script follows the workload contract (--print-pipeline, --pipeline, --report): it "
        "chooses the pipeline and measures itself",
    )
    runs.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="a script run unchanged: steps the session leaves out of the step time (default: 5)",
    )
    runs.add_argument(
        "--metric",
        metavar="NAME",
        help="a script run unchanged: the metric is the last number it prints after NAME "
        "(accuracy reads 'accuracy 0.84' or 'accuracy: 0.84')",
    )
    runs.add_argument("--kwargs", help="function targets: JSON object of keyword arguments (or a file)")
    runs.add_argument(
        "--no-retry-failed",
        action="store_true",
        help="on resume, keep recorded errors and timeouts instead of running them again",
    )
    runs.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    runs.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on the machines of the Ray cluster at ADDRESS ('auto' on a node of it, or the head's "
        "HOST:PORT), one run per machine at a time; needs pip install 'xlapipe[ray]' (docs/scale-out.md)",
    )
    runs.add_argument(
        "--ray-resources",
        metavar="JSON",
        help="with --ray: what a run holds on its machine (default: the host's every TPU), "
        "e.g. '{\"TPU-v4-16-head\": 1}' for a slice through its first host",
    )
    runs.add_argument(
        "--resume",
        action="store_true",
        help="continue the ablation recorded in --out, running only what is missing (refused when "
        "--out has none); the same command without it resumes too",
    )
    ab.add_argument("--out", default="results/ablation", help="output folder (default: %(default)s)")
    ab.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_judging(ab)

    rep = sub.add_parser("report", help="write the tables and plots again from OUT/results.jsonl")
    rep.add_argument("out", help="an ablation's output folder (or its results.jsonl)")
    _add_judging(rep)

    _add_doctor(sub)
    return parser


def _add_doctor(sub: Any) -> None:
    from xlapipe.doctor.command import add_arguments

    add_arguments(
        sub.add_parser(
            "doctor",
            help="run a training script for a few steps and say what is slow, where, and the fix",
            description="Run a training script (plain torch_xla or xlapipe) unchanged, in a fresh "
            "process, for at most --steps steps; arguments after -- go to the script. See docs/doctor.md.",
        )
    )


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
    from xlapipe.ablation import Judging, Output, Runs, Variants, ablate, report
    from xlapipe.ablation.results import RESULTS_FILE

    kwargs = _kwargs(opts.kwargs)
    variants = Variants(
        mode=opts.mode,
        pipeline=None if opts.pipeline is None else _pipeline(opts.pipeline),
        baseline=opts.baseline,
        reference=opts.reference,
        factors=opts.factors,
        order=opts.order,
        cumulative=not opts.independent,
        explicit=None if opts.variants is None else _json(opts.variants, "--variants"),
        design=opts.design,
        eager_reference=opts.eager_reference,
        aa=opts.aa,
        imports=opts.imports,
    )
    judging = Judging(
        repeats=opts.repeats,
        until_resolved=opts.until_resolved,
        max_rounds=opts.max_rounds,
        budget=opts.budget,
        **_given(opts, JUDGING_FLAGS),
    )
    runs = Runs(
        timeout=opts.timeout,
        python=opts.python,
        contract=opts.contract,
        warmup=opts.warmup,
        metric=opts.metric,
        retry_failed=not opts.no_retry_failed,
        ray=opts.ray,
        ray_resources=opts.ray_resources,
    )
    output = Output(opts.out, progress=not opts.no_progress)
    if opts.resume and not os.path.exists(os.path.join(out_folder := str(output.folder), RESULTS_FILE)):
        raise ValueError(
            f"--resume: {out_folder} has no {RESULTS_FILE} to continue; check --out, or leave out --resume"
        )
    results = ablate(
        opts.target,
        rest if kwargs is None else kwargs,
        variants=variants,
        judging=judging,
        runs=runs,
        output=output,
    )
    print()
    print(results.table())
    out = str(output.folder)
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

    results = Results.load(opts.out, **_given(opts, JUDGING_FLAGS))
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
    parser = _parser(doctor_only=argv[:1] == ["doctor"])
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
        signum = getattr(stop, "signum", 2)  # xlapipe.child_process.Interrupted has it
        name = "SIGTERM" if signum == 15 else "Ctrl-C (SIGINT)" if signum == 2 else f"signal {signum}"
        print(
            f"xlapipe {opts.command}: interrupted by {name}: the runs in flight were stopped and not "
            "recorded; run the same command again to resume",
            file=sys.stderr,
        )
        return 128 + signum
    except (ValueError, FileNotFoundError, RuntimeError, OSError, ImportError) as error:
        print(f"xlapipe {opts.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
