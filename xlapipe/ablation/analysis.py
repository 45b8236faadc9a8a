"""From an ablation's runs to what they say: figures per variant, paired verdicts, effects.

Pure: takes the variants and their run records (as written to the results
file), returns an :class:`Analysis` value that the reports render. Nothing
here reads files or runs anything.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from attrs import evolve, field, frozen

from xlapipe.ablation.options import Judging, TargetMetric
from xlapipe.ablation.stats import (
    EffectFit,
    Interval,
    Stats,
    Verdict,
    finite,
    fit_effects,
    paired_interval,
    verdict,
)
from xlapipe.ablation.variants import Variant
from xlapipe.pipeline import Pipeline

# The figures a run reports, in the order the table, CSV and plot show them (other numeric keys are kept).
FIGURES = (
    "epoch_s",
    "wall_s",
    "steps_per_s",
    "step_s",
    "first_update_s",
    "eval_s",
    "time_to_target_s",
    "compiles_total",
    "compiles_after_warmup",
    "compile_s_total",
    "compile_s_after_warmup",
    "execute_s_after_warmup",
    "transfer_to_device_s_after_warmup",
    "wall_over_execute",
    "peak_rss_mb",
    "final_loss",
    "metric",
)
# Report keys where more is better; the speed-up of such a figure is variant / reference.
HIGHER_IS_BETTER = frozenset({"steps_per_s", "metric"})
# The phases shown as separate figures (time to first update includes compilation).
PHASES = ("first_update_s", "step_s", "eval_s", "time_to_target_s")
PHASE_LABELS = {
    "first_update_s": "time to the first update (s)",
    "step_s": "steady-state step (s)",
    "eval_s": "evaluation (s)",
    "time_to_target_s": "time to the target metric (s)",
}


def check_figure(figure: str, allowed: Collection[str]) -> None:
    """Refuse ``figure`` unless it is one of ``allowed``, naming them."""
    if figure not in allowed:
        known = [k for k in FIGURES if k in allowed] + sorted(set(allowed) - set(FIGURES))
        raise ValueError(f"unknown figure {figure!r}; choose one of {', '.join(known) or '(none)'}")


def time_to_target(history: Any, target: TargetMetric) -> float | None:
    """The first elapsed time in ``[[elapsed_s, value], ...]`` whose value reaches ``target``."""
    if not isinstance(history, list):
        return None
    for point in history:
        if (
            isinstance(point, (list, tuple))
            and len(point) == 2
            and all(finite(x) for x in point)
            and target.reached(point[1])
        ):
            return float(point[0])
    return None


def run_figures(report: Mapping[str, Any] | None, target: TargetMetric | None = None) -> dict[str, float]:
    """The numeric figures of one run's report, with the derived ones (step_s, time_to_target_s)."""
    report = report or {}
    out = {k: float(v) for k, v in report.items() if finite(v)}
    rate = out.get("steps_per_s")
    if "step_s" not in out and rate and rate > 0:
        out["step_s"] = 1.0 / rate
    if target is not None:
        reached = time_to_target(report.get("metric_history"), target)
        if reached is not None:
            out["time_to_target_s"] = reached
    return out


@frozen
class Summary:
    """One variant's runs, reduced: statuses, figures, comparison with the reference."""

    variant: Variant
    is_baseline: bool
    statuses: dict[str, int]
    figures: dict[str, Stats]
    errors: tuple[tuple[int, str, str], ...]  # (repeat, status, error text) of failed runs
    change_pct: float | None = None  # (variant - reference) / reference, on the medians of the figure
    speedup_x: float | None = None  # reference / variant on the medians (above 1 is faster)
    interval: Interval | None = None  # the speed-up paired by round, with its interval
    verdict: Verdict | None = None
    values: dict[int, float] = field(factory=dict)  # repeat -> the figure, successful runs
    limits: tuple[float, ...] = ()  # the time limits of the runs that timed out (censored: longer than that)

    @property
    def runs(self) -> str:
        total = sum(self.statuses.values())
        if not total:
            return "not run"
        parts = [f"{self.statuses.get('ok', 0)}/{total} ok"]
        parts += [f"{n} {s}" for s, n in sorted(self.statuses.items()) if s != "ok" and n]
        if self.limits:
            parts[-1] += f" (run > {min(self.limits):.0f} s)"
        return ", ".join(parts)

    @property
    def ok_runs(self) -> int:
        return self.statuses.get("ok", 0)


ALTERNATIVES = "As fast as far as the runs can tell, with more transforms or later in the plan: "


@frozen
class Recommendation:
    """The pipeline to run, why, and what else was considered (made by :mod:`xlapipe.ablation.recommend`)."""

    variant: str
    pipeline: Pipeline
    python: str
    json: str
    reason: str
    excluded: tuple[tuple[str, str], ...] = ()  # (variant, why it was not a candidate)
    alternatives: tuple[str, ...] = ()  # the other candidates with no detectable difference from the fastest

    def text(self) -> str:
        lines = [f"Recommended pipeline: {self.variant}", f"  {self.reason}"]
        if self.alternatives:
            lines.append("  " + ALTERNATIVES + ", ".join(self.alternatives))
        lines += [
            "",
            "As Python:",
            "",
            self.python,
            "",
            "As JSON (--pipeline, Pipeline.from_description):",
            "",
            self.json,
        ]
        return "\n".join(lines)


def _summary_tuple(items: Iterable[Summary]) -> tuple[Summary, ...]:
    return tuple(items)


@frozen
class Analysis:
    """What an ablation's runs say, ready to render."""

    mode: str
    baseline: str
    summaries: tuple[Summary, ...] = field(converter=_summary_tuple)
    judging: Judging = field(factory=Judging)
    refused: tuple[Any, ...] = ()
    design: str = ""
    effects: EffectFit | None = None
    recommendation: Recommendation | None = None
    notes: tuple[str, ...] = ()

    @property
    def figure(self) -> str:
        return self.judging.figure

    @property
    def reference(self) -> Summary | None:
        """The summary every variant is compared with (None when no variant is the baseline)."""
        return next((s for s in self.summaries if s.is_baseline), None)

    @property
    def unresolved(self) -> tuple[str, ...]:
        """Variants whose interval neither excludes 1 nor is narrower than the resolution asked."""
        return tuple(
            s.variant.name
            for s in self.summaries
            if not s.is_baseline and s.verdict is not None and not s.verdict.resolved
        )

    @property
    def variants(self) -> tuple[Variant, ...]:
        return tuple(s.variant for s in self.summaries)

    def __getitem__(self, name: str) -> Summary:
        for s in self.summaries:
            if s.variant.name == name:
                return s
        raise KeyError(f"no variant {name!r}; variants: {', '.join(s.variant.name for s in self.summaries)}")


def summarise(
    variant: Variant,
    runs: Sequence[Mapping[str, Any]],
    is_baseline: bool,
    figure: str,
    target: TargetMetric | None = None,
) -> Summary:
    """A variant's statuses, figure statistics and per-round values of ``figure``."""
    statuses: dict[str, int] = {}
    for r in runs:
        status = r.get("status", "error")
        statuses[status] = statuses.get(status, 0) + 1
    ok = [(int(r["repeat"]), run_figures(r.get("report"), target)) for r in runs if r.get("status") == "ok"]
    keys = sorted({k for _, figs in ok for k in figs})
    figures = {k: s for k in keys if (s := Stats.of(figs.get(k) for _, figs in ok)) is not None}
    values = {rep: figs[figure] for rep, figs in ok if figure in figs}
    errors = tuple(
        (int(r["repeat"]), r.get("status", "error"), r.get("error") or "")
        for r in runs
        if r.get("status") != "ok"
    )
    limits = tuple(
        float(r["limit_s"]) for r in runs if r.get("status") == "timeout" and finite(r.get("limit_s"))
    )
    return Summary(variant, is_baseline, statuses, figures, errors, values=values, limits=limits)


def compare(summary: Summary, reference: Summary, judging: Judging) -> Summary:
    """``summary`` with its change, speed-up, paired interval and verdict against ``reference``."""
    figure = judging.figure
    higher = figure in HIGHER_IS_BETTER
    mine, ref = summary.figures.get(figure), reference.figures.get(figure)
    if summary is reference:
        same = 1.0 if mine is not None and mine.median > 0 else None
        return evolve(
            summary, change_pct=same and 0.0, speedup_x=same, verdict=Verdict("reference", "", True)
        )
    change = speedup = None
    if mine is not None and ref is not None and mine.median > 0 and ref.median > 0:
        change = 100.0 * (mine.median - ref.median) / ref.median
        speedup = mine.median / ref.median if higher else ref.median / mine.median
    interval = paired(summary, reference, figure, judging.level)
    judged = verdict(interval, judging.resolution) if summary.ok_runs else None
    return evolve(summary, change_pct=change, speedup_x=speedup, interval=interval, verdict=judged)


def paired(summary: Summary, reference: Summary, figure: str, level: float) -> Interval | None:
    """The speed-up of ``summary`` over ``reference`` on ``figure``, paired by round, with its interval."""
    common = sorted(set(summary.values) & set(reference.values))
    return paired_interval(
        [reference.values[r] for r in common],
        [summary.values[r] for r in common],
        level,
        higher_is_better=figure in HIGHER_IS_BETTER,
    )


def factorial_rows(
    summaries: Sequence[Summary], factors: Sequence[str], figure: str
) -> list[tuple[frozenset[str], int, float]]:
    """(factors on, repeat, time) for every successful run, for :func:`fit_effects`."""
    higher = figure in HIGHER_IS_BETTER
    rows = []
    for s in summaries:
        on = frozenset(set(s.variant.pipeline.names) & set(factors))
        for rep, value in s.values.items():
            if value > 0:
                rows.append((on, rep, 1.0 / value if higher else value))
    return rows


def analyse(
    variants: Sequence[Variant],
    baseline: str,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    judging: Judging | None = None,
    *,
    mode: str = "",
    refused: Sequence[Any] = (),
    factors: Sequence[str] = (),
    design: str = "",
    recommend: Callable[[Analysis], Recommendation | None] | None = None,
    notes: Sequence[str] = (),
) -> Analysis:
    """Summarise each variant's ``runs`` (by variant name), compare with ``baseline``, fit effects.

    ``recommend`` is a function of the :class:`Analysis` returning a
    recommendation (see :mod:`xlapipe.ablation.recommend`), or None.
    """
    judging = judging or Judging()
    figure, target = judging.figure, judging.target_metric
    summaries = [summarise(v, runs.get(v.name, ()), v.name == baseline, figure, target) for v in variants]
    reference = next((s for s in summaries if s.is_baseline), None)
    if reference is not None:
        summaries = [compare(s, reference, judging) for s in summaries]
    effects = None
    if mode == "factorial" and factors:
        effects = fit_effects(factorial_rows(summaries, factors, figure), list(factors), judging.confidence)
    result = Analysis(mode, baseline, summaries, judging, tuple(refused), design, effects, None, tuple(notes))
    if recommend is not None:
        result = evolve(result, recommendation=recommend(result))
    return result
