"""The recommended pipeline: the fastest variant that keeps the reference's loss and metric.

Among the variants whose median final loss and metric stay within a relative
``tolerance`` of the reference's, the fastest one (median of the compared
figure). It is checked, paired by repeat, against the fastest variant of all:
when that one is faster but changes the loss or the metric, the report says
whether the recommendation is significantly slower than it. Simpler variants
(fewer transforms) the data cannot tell apart from the recommendation are
listed as alternatives. The pipeline is given as Python and as the JSON that
``Pipeline.from_description`` and the workload scripts' ``--pipeline`` accept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from xlapipe.ablation.analysis import (
    HIGHER_IS_BETTER,
    Analysis,
    Recommendation,
    Summary,
    check_judging,
    paired,
)
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


def _slower_than(a: Summary, b: Summary, analysis: Analysis) -> bool | None:
    """True when ``a`` is significantly slower than ``b`` (paired), None when it cannot be told."""
    interval = paired(a, b, analysis.figure, analysis.confidence)
    if interval is None or not interval.decided:
        return None
    assert interval.high is not None  # decided: the interval has both ends
    return interval.high < 1.0


def recommend(analysis: Analysis, tolerance: float = 0.02) -> Recommendation | None:
    """The recommendation for ``analysis``, or None when no variant has a successful run."""
    check_judging(tolerance=tolerance)
    measured = [s for s in analysis.summaries if analysis.figure in s.figures]
    if not measured:
        return None
    reference = next((s for s in analysis.summaries if s.is_baseline), None)
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
    best = min(measured, key=key)
    chosen = min(candidates, key=key)
    ref_name = reference.variant.name if reference is not None else "the reference"
    checked = [k for k in CHECKED if reference is not None and k in reference.figures]
    what = " and ".join(k.replace("_", " ") for k in checked)
    reason = (
        f"the fastest variant ({analysis.figure} median {chosen.figures[analysis.figure].median:.3g})"
        + (
            f" whose {what} stay{'s' * (len(checked) == 1)} within {tolerance:.0%} of {ref_name}'s"
            if checked
            else f"; {ref_name} reports no final loss or metric, so none was checked"
        )
    )
    if best is not chosen:
        slower = _slower_than(chosen, best, analysis)
        state = (
            "significantly slower than"
            if slower
            else "not significantly slower than"
            if slower is False
            else "not yet comparable (too few paired repeats) with"
        )
        reason += f"; it is {state} {best.variant.name}, which is faster but changes the loss or metric"
    alternatives = tuple(
        s.variant.name
        for s in sorted(candidates, key=key)
        if s is not chosen
        and len(s.variant.pipeline) < len(chosen.variant.pipeline)
        and _slower_than(s, chosen, analysis) is False
    )
    pipeline = chosen.variant.pipeline
    return Recommendation(
        chosen.variant.name,
        pipeline,
        python_code(pipeline),
        json.dumps(pipeline.describe()),
        reason,
        tuple(excluded),
        alternatives,
    )
