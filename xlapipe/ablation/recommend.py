"""The recommended pipeline: the simplest variant as fast as the fastest that keeps loss and metric.

The candidates are the rows that run on the XLA device (eager PyTorch on the
CPU is a reference row, never the answer) and do not change training: their
median final loss and metric stay within the run-to-run spread, or within a
relative ``tolerance``, of the reference's. Among them, the fastest
(median of the compared figure) and every candidate with no detectable
difference from it (its paired interval against the fastest holds 1) are
equally fast as far as the runs can tell; of those, the one with the fewest
transforms is recommended (the earlier in the plan on a tie). A median that
leads by noise does not decide, so running the same ablation again recommends
the same pipeline. When a variant that changes the loss or the metric is
faster still, the reason says whether the recommendation is significantly
slower than it. The pipeline is given as Python and as the JSON that
``Pipeline.from_description`` and the workload scripts' ``--pipeline`` accept.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from typing import Any

from xlapipe.ablation.analysis import (
    HIGHER_IS_BETTER,
    Analysis,
    Recommendation,
    Summary,
    changes_training,
    paired,
    twin_of,
)
from xlapipe.ablation.stats import Interval
from xlapipe.pipeline import Pipeline
from xlapipe.transform import PRACTICES

CHECKED = ("final_loss", "metric")


def python_code(pipeline: Pipeline) -> str:
    """Python source that builds ``pipeline``: each call's parameters written as literals that read back equal."""
    description = pipeline.describe()
    lines = ["import xlapipe as xp", ""]
    if not description:
        lines.append("pipeline = xp.Pipeline()  # eager PyTorch on the CPU: no transform")
    else:
        lines.append("pipeline = xp.Pipeline(")
        for item in description:
            params = ", ".join(f"{k}={_literal(v)}" for k, v in item["params"].items())
            call = (
                f"xp.{item['name']}({params})"
                if item["name"] in PRACTICES
                else f"xp.rebuild({item['name']!r}, {item['params']!r})  # import its module first"
            )
            lines.append(f"    {call},")
        lines.append(")")
    if not all(_reads_back(v) for item in description for v in item["params"].values()):
        return f"import xlapipe as xp\n\npipeline = xp.Pipeline.from_description({description!r})"
    return "\n".join(lines)


def _literal(value: Any) -> str:
    if isinstance(value, list):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})"
    return repr(value)


def _reads_back(value: Any) -> bool:
    """True when :func:`_literal` of ``value`` is Python that evaluates to it (not so for nan, say)."""
    try:
        return bool(ast.literal_eval(_literal(value)) == _tupled(value))
    except (ValueError, SyntaxError):
        return False


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _against(a: Summary, b: Summary, analysis: Analysis, comparisons: int = 1) -> Interval | None:
    """``a``'s speed-up over ``b``, paired, as one of ``comparisons`` that share the confidence."""
    level = 1.0 - (1.0 - analysis.judging.confidence) / max(comparisons, 1)
    return paired(a, b, analysis.figure, level)


def _word(interval: Interval | None) -> str:
    """ "slower" or "faster" (significantly), "same" (the interval holds 1), "" (no interval)."""
    if interval is None or interval.low is None or interval.high is None:
        return ""
    return "faster" if interval.low > 1.0 else "slower" if interval.high < 1.0 else "same"


def _span(interval: Interval | None) -> str:
    """How far apart the runs can tell two variants: the paired interval, in words."""
    assert interval is not None and interval.low is not None and interval.high is not None  # a tie has one
    reach = interval.resolution or 0.0
    more = "" if reach <= 0.1 else ": more rounds would tell them apart better"
    return f"paired speed-up {interval.low:.3g}x-{interval.high:.3g}x{more}"


def _time_like(analysis: Analysis) -> Callable[[Summary], float]:
    """A row's figure as a time (lower is faster): a rate (steps/s, a metric) is turned over."""
    higher = analysis.figure in HIGHER_IS_BETTER

    def key(s: Summary) -> float:
        value = s.figures[analysis.figure].median
        return (1.0 / value if value > 0 else float("inf")) if higher else value

    return key


def _changes_training(s: Summary, reference: Summary | None, tolerance: float) -> str:
    """How ``s`` changes what the model learns against ``reference``, beyond the runs' spread, or ""."""
    if reference is None or s is reference:
        return ""
    for key in CHECKED:
        mine, ref = s.figures.get(key), reference.figures.get(key)
        if ref is not None and mine is None:
            return f"reports no {key}"
        if changes_training(mine, ref, tolerance) is not None:
            assert mine is not None and ref is not None
            spread = max(mine.max - mine.min, ref.max - ref.min)
            return (
                f"changes training: {key.replace('_', ' ')} {mine.median:.4g} against "
                f"{reference.variant.name}'s {ref.median:.4g}, beyond the run-to-run spread ({spread:.2g}) "
                f"and {tolerance:.0%}"
            )
    return ""


CPU_HOST = (
    "These figures are this host's: XLA on the CPU (PJRT_DEVICE=CPU), where eager PyTorch can be "
    "faster and the practices weigh otherwise than on a TPU. To choose a TPU pipeline, run the same "
    "command on a TPU VM (torch_xla finds the TPU by itself; PJRT_DEVICE=TPU): `make ablate`, or "
    "`xlapipe ablate SCRIPT ... --out OUT`."
)


def recommend(analysis: Analysis) -> Recommendation | None:
    """The recommendation for ``analysis``, or None when no XLA row keeps the loss and metric.

    Eager PyTorch on the CPU is a reference row, never the answer, when some
    row runs on the XLA device; an A/A row is its twin's duplicate.
    """
    tolerance = analysis.judging.tolerance
    measured = [s for s in analysis.summaries if analysis.figure in s.figures]
    if not measured:
        return None
    reference = analysis.reference
    on_xla = any(s.xla for s in measured)
    excluded: list[tuple[str, str]] = []
    candidates = []
    for s in measured:
        why = ""
        if on_xla and not s.xla:
            why = "eager PyTorch on the CPU: a reference row, not a pipeline for the XLA device"
        elif twin_of(s) is not None:
            why = f"the A/A twin of {twin_of(s)} (the same pipeline)"
        elif reference is not None and reference.ok_runs:
            why = _changes_training(s, reference, tolerance)
        if why:
            excluded.append((s.variant.name, why))
        else:
            candidates.append(s)
    if not candidates:
        return None
    key = _time_like(analysis)
    fastest = min(candidates, key=key)
    against = {s.variant.name: _against(s, fastest, analysis, len(candidates) - 1) for s in candidates}
    tied = [s for s in candidates if s is fastest or _word(against[s.variant.name]) == "same"]
    chosen = min(tied, key=lambda s: len(s.variant.pipeline))  # min keeps the earliest of equals
    median = chosen.figures[analysis.figure].median
    ref_name = reference.variant.name if reference is not None else "the reference"
    checked = [k for k in CHECKED if reference is not None and k in reference.figures]
    what = " and ".join(k.replace("_", " ") for k in checked)
    size = f"{len(chosen.variant.pipeline)} transform{'s' * (len(chosen.variant.pipeline) != 1)}"
    reason = (
        f"the fastest variant ({analysis.figure} median {median:.3g})"
        if chosen is fastest
        else f"the simplest variant ({size}) with no detectable difference from the fastest, "
        f"{fastest.variant.name} ({analysis.figure} median {median:.3g} against "
        f"{fastest.figures[analysis.figure].median:.3g}; {_span(against[chosen.variant.name])})"
    )
    reason += (
        f", whose {what} stay{'s' * (len(checked) == 1)} within the run-to-run spread (or {tolerance:.0%}) "
        f"of {ref_name}'s"
        if checked
        else f"; {ref_name} reports no final loss or metric, so none was checked"
    )
    best = min((s for s in measured if s.xla or not on_xla), key=key)
    if best not in candidates and twin_of(best) is None:
        state = {
            "slower": "significantly slower than",
            "same": "not significantly slower than",
            "faster": "faster than",
        }.get(_word(_against(chosen, best, analysis)), "not yet comparable (too few paired rounds) with")
        reason += f"; it is {state} {best.variant.name}, which is faster but changes the loss or metric"
    if "CPU" in analysis.devices:
        reason += ". " + CPU_HOST.rstrip(".")
    pipeline = chosen.variant.pipeline
    return Recommendation(
        chosen.variant.name,
        pipeline,
        python_code(pipeline),
        json.dumps(pipeline.describe()),
        reason,
        tuple(excluded),
        tuple(s.variant.name for s in tied if s is not chosen),
    )
