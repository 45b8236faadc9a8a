"""The recommended pipeline: the simplest variant as fast as the fastest that keeps loss and metric.

The candidates are the variants whose median final loss and metric stay
within a relative ``tolerance`` of the reference's. Among them, the fastest
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

import json
from collections.abc import Callable
from typing import Any

from xlapipe.ablation.analysis import HIGHER_IS_BETTER, Analysis, Recommendation, Summary, paired
from xlapipe.ablation.stats import Interval
from xlapipe.pipeline import Pipeline
from xlapipe.transform import FACTORIES

CHECKED = ("final_loss", "metric")


def python_code(pipeline: Pipeline) -> str:
    """Python source that builds ``pipeline`` (checked: running it gives an equal pipeline)."""
    description = pipeline.describe()
    lines = ["import xlapipe as xp", ""]
    if not description:
        lines.append("pipeline = xp.Pipeline()  # eager PyTorch on the CPU: no transform")
    else:
        lines.append("pipeline = xp.Pipeline(")
        for item in description:
            params = ", ".join(f"{k}={_literal(v)}" for k, v in item["params"].items())
            factory = FACTORIES.get(item["name"])
            builtin = factory is not None and factory.__module__.startswith("xlapipe.")
            call = (
                f"xp.{item['name']}({params})"
                if builtin
                else f"xp.rebuild({item['name']!r}, {item['params']!r})  # import its module first"
            )
            lines.append(f"    {call},")
        lines.append(")")
    code = "\n".join(lines)
    if _built(code) != pipeline:  # a parameter that does not round-trip as a literal
        code = f"import xlapipe as xp\n\npipeline = xp.Pipeline.from_description({description!r})"
    return code


def _literal(value: Any) -> str:
    if isinstance(value, list):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})"
    return repr(value)


def _built(code: str) -> Pipeline | None:
    scope: dict[str, Any] = {}
    try:
        exec(compile(code, "<recommended pipeline>", "exec"), scope)
    except Exception:
        return None
    return scope.get("pipeline")


def _within(summary: Summary, reference: Summary, tolerance: float) -> str:
    """Why ``summary`` leaves the reference's loss or metric, or "" when it keeps them."""
    for key in CHECKED:
        ref = reference.figures.get(key)
        if ref is None:
            continue
        mine = summary.figures.get(key)
        if mine is None:
            return f"reports no {key}"
        allowed = tolerance * max(abs(ref.median), 1e-12)
        if abs(mine.median - ref.median) > allowed:
            return (
                f"{key} {mine.median:.4g} against the reference's {ref.median:.4g} "
                f"(more than {tolerance:.0%} apart)"
            )
    return ""


def _faster_key(analysis: Analysis) -> Callable[[Summary], float]:
    higher = analysis.figure in HIGHER_IS_BETTER

    def key(s: Summary) -> float:
        value = s.figures[analysis.figure].median
        return -value if higher else value

    return key


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


def recommend(analysis: Analysis) -> Recommendation | None:
    """The recommendation for ``analysis``, or None when no variant keeps the loss and metric."""
    tolerance = analysis.judging.tolerance
    measured = [s for s in analysis.summaries if analysis.figure in s.figures]
    if not measured:
        return None
    reference = analysis.reference
    excluded: list[tuple[str, str]] = []
    candidates = []
    for s in measured:
        why = _within(s, reference, tolerance) if reference is not None and reference.ok_runs else ""
        if why:
            excluded.append((s.variant.name, why))
        else:
            candidates.append(s)
    if not candidates:
        return None
    key = _faster_key(analysis)
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
        f", whose {what} stay{'s' * (len(checked) == 1)} within {tolerance:.0%} of {ref_name}'s"
        if checked
        else f"; {ref_name} reports no final loss or metric, so none was checked"
    )
    best = min(measured, key=key)
    if best not in candidates:
        state = {
            "slower": "significantly slower than",
            "same": "not significantly slower than",
            "faster": "faster than",
        }.get(_word(_against(chosen, best, analysis)), "not yet comparable (too few paired rounds) with")
        reason += f"; it is {state} {best.variant.name}, which is faster but changes the loss or metric"
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
