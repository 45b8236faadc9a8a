"""From an ablation's runs to what they say: figures per variant, paired verdicts, effects.

Pure: takes the variants and their run records (as written to the results
file), returns an :class:`Analysis` value that the reports render. Nothing
here reads files or runs anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from attrs import evolve, field, frozen

from xlapipe.ablation.options import Judging, TargetMetric
from xlapipe.ablation.stats import (
    EffectFit,
    Interval,
    Stats,
    Verdict,
    blocked_intervals,
    finite,
    fit_effects,
    holm_levels,
    paired_interval,
    verdict,
)
from xlapipe.ablation.variants import AA_NOTE, Variant
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


Block = tuple[int, str]  # (round, machine): the runs a paired comparison matches


def machine_of(record: Mapping[str, Any]) -> str:
    """The machine that ran ``record``: its host name, with a cluster's node id (12 digits) after it."""
    machine = record.get("machine")
    if not isinstance(machine, Mapping):
        return ""  # records that do not say
    host, node = str(machine.get("host") or ""), str(machine.get("node") or "")
    return f"{host}/{node[:12]}" if node else host


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
    values: dict[Block, float] = field(factory=dict)  # (round, machine) -> the figure, successful runs
    limits: tuple[float, ...] = ()  # the time limits of the runs that timed out (censored: longer than that)
    previous: str | None = None  # the row of the first verdict column (add-one: the row before)
    increment: Interval | None = None  # the speed-up over ``previous``, paired by block
    increment_verdict: Verdict | None = None
    increment_note: str = ""  # e.g. "skips +x (failed)"
    training: tuple[str, ...] = ()  # how it changes what the model learns, beyond the runs' spread
    machines: tuple[str, ...] = ()  # the machines its successful runs ran on
    xla: bool = False  # it ran on the XLA device (not eager PyTorch on the CPU)

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

    @property
    def decisive(self) -> Verdict | None:
        """The verdict that decides the row: its increment's when it has one, else against the baseline."""
        return self.increment_verdict if self.previous is not None else self.verdict

    @property
    def deciding(self) -> Interval | None:
        """The interval behind :attr:`decisive`: the increment's when the row has one, else the baseline's."""
        return self.increment if self.previous is not None else self.interval

    @property
    def failed(self) -> str:
        """Why no run of this row succeeded ("" when one did): the last error's last line."""
        if self.ok_runs or not self.errors:
            return ""
        lines = self.errors[-1][2].strip().splitlines() or [self.errors[-1][1]]
        return lines[0] if lines[0].startswith(("killed by", "timed out")) else lines[-1]


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
    devices: tuple[str, ...] = ()  # the PJRT devices the runs ran on ("CPU", "TPU"; none recorded: empty)

    @property
    def figure(self) -> str:
        return self.judging.figure

    @property
    def reference(self) -> Summary | None:
        """The summary every variant is compared with (None when no variant is the baseline)."""
        return next((s for s in self.summaries if s.is_baseline), None)

    @property
    def unresolved(self) -> tuple[str, ...]:
        """Rows whose deciding interval neither excludes 1 nor is narrower than the resolution asked.

        The deciding interval is the row's increment (over the row before in
        add-one, over the full pipeline in leave-one-out, over its twin for the
        A/A pair), else its comparison with the baseline.
        """
        return tuple(
            s.variant.name
            for s in self.summaries
            if not s.is_baseline and s.decisive is not None and not s.decisive.resolved
        )

    def needed(self) -> tuple[str, ...]:
        """The rows a next round runs: the unresolved ones and the rows they are compared with."""
        names = set(self.unresolved)
        for s in self.summaries:
            if s.variant.name in self.unresolved:
                names.add(s.previous if s.previous is not None else self.baseline)
        return tuple(s.variant.name for s in self.summaries if s.variant.name in names)

    @property
    def increments(self) -> bool:
        """True when the table's first verdict column compares each row with another (not the baseline)."""
        return any(s.previous is not None for s in self.summaries)

    @property
    def machines(self) -> tuple[str, ...]:
        return tuple(sorted({m for s in self.summaries for m in s.machines}))

    def machine_speeds(self) -> dict[str, float]:
        """Each machine's time for the same work relative to the fleet's (geometric) mean; 1.0 on one machine.

        Per variant, a machine's mean log figure against the variant's mean
        over every machine, averaged over the variants the machine ran.
        """
        offsets: dict[str, list[float]] = {}
        for s in self.summaries:
            logs: dict[str, list[float]] = {}
            for (_, machine), value in s.values.items():
                if value > 0 and math.isfinite(value):
                    logs.setdefault(machine, []).append(math.log(value))
            if len(logs) < 2:
                continue
            mean = statistics.fmean(statistics.fmean(vs) for vs in logs.values())
            for machine, vs in logs.items():
                offsets.setdefault(machine, []).append(statistics.fmean(vs) - mean)
        return {m: math.exp(statistics.fmean(o)) for m, o in sorted(offsets.items())}

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
    ok = [
        ((int(r["repeat"]), machine_of(r)), run_figures(r.get("report"), target))
        for r in runs
        if r.get("status") == "ok"
    ]
    keys = sorted({k for _, figs in ok for k in figs})
    figures = {k: s for k in keys if (s := Stats.of(figs.get(k) for _, figs in ok)) is not None}
    values = {block: figs[figure] for block, figs in ok if figure in figs}
    xla = "with_device" in variant.pipeline.names or any(
        "compiles_total" in (r.get("report") or {}) for r in runs if r.get("status") == "ok"
    )
    errors = tuple(  # a run lost with its machine was run again elsewhere: not a failure of the variant
        (int(r["repeat"]), r.get("status", "error"), r.get("error") or "")
        for r in runs
        if r.get("status") not in ("ok", "lost")
    )
    limits = tuple(
        float(r["limit_s"]) for r in runs if r.get("status") == "timeout" and finite(r.get("limit_s"))
    )
    machines = tuple(sorted({m for (_, m), _ in ok if m}))
    return Summary(
        variant,
        is_baseline,
        statuses,
        figures,
        errors,
        values=values,
        limits=limits,
        machines=machines,
        xla=xla,
    )


def compare(summary: Summary, reference: Summary, judging: Judging, level: float | None = None) -> Summary:
    """``summary`` with its change, speed-up, paired interval and verdict against ``reference``.

    ``level``: the interval's confidence (default: ``judging.level``, one comparison's share).
    """
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
    interval = paired(summary, reference, figure, judging.level if level is None else level)
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
        for (round_, _machine), value in s.values.items():
            if value > 0:
                rows.append((on, round_, 1.0 / value if higher else value))
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
        summaries = against_baseline(summaries, reference, judging)
    summaries = with_increments(summaries, partners(mode, summaries), judging)
    summaries = learning(summaries, judging)
    effects = None
    if mode == "factorial" and factors:
        effects = fit_effects(factorial_rows(summaries, factors, figure), list(factors), judging.confidence)
    devices = tuple(
        sorted({str(r["pjrt_device"]) for rs in runs.values() for r in rs if r.get("pjrt_device")})
    )
    result = Analysis(
        mode, baseline, summaries, judging, tuple(refused), design, effects, None, tuple(notes), devices
    )
    if recommend is not None:
        result = evolve(result, recommendation=recommend(result))
    return result


# -- the rows compared with one another ------------------------------------------------------


def is_reference_row(s: Summary) -> bool:
    """Eager PyTorch on the CPU added as an extra row (the empty pipeline, not the baseline)."""
    return not len(s.variant.pipeline) and not s.is_baseline


def twin_of(s: Summary) -> str | None:
    """The row an A/A row repeats (its note says so), else None."""
    note = s.variant.note
    return note[len(AA_NOTE) :].split(":")[0].strip() if note.startswith(AA_NOTE) else None


def partners(mode: str, summaries: Sequence[Summary]) -> dict[str, tuple[str, str]]:
    """Each row's partner in the first verdict column, with a note: {row: (partner, note)}.

    Add-one: the nearest row before it that has a successful run (a failed row
    is skipped, and the note says so); leave-one-out: the full pipeline; an
    A/A row: the row it repeats. Eager PyTorch on the CPU as an extra row and
    the baseline get none; nor does any row in the other modes.
    """
    out: dict[str, tuple[str, str]] = {}
    names = {s.variant.name for s in summaries}
    for s in summaries:
        twin = twin_of(s)
        if twin is not None and twin in names:
            out[s.variant.name] = (twin, "A/A: the same pipeline run twice, the noise floor")
    if mode == "add-one":
        chain = [s for s in summaries if not is_reference_row(s) and twin_of(s) is None]
        start = next((i for i, s in enumerate(chain) if s.is_baseline), 0)
        for i in range(start + 1, len(chain)):
            skipped = []
            for before in reversed(chain[start:i]):
                if before.ok_runs:
                    break
                skipped.append(before)
            else:
                before = chain[start]
            note = "; ".join(f"skips {b.variant.name} (failed: {b.failed})" for b in reversed(skipped))
            out[chain[i].variant.name] = (before.variant.name, note)
    elif mode == "leave-one-out":
        full = next((s for s in summaries if s.variant.name == "full"), None)
        if full is not None:
            for s in summaries:
                if s is not full and twin_of(s) is None and not is_reference_row(s):
                    out[s.variant.name] = (full.variant.name, "")
    return out


def _alpha(judging: Judging) -> float:
    """The error each look may spend over the family of comparisons (its share of the looks)."""
    return 1.0 - judging.level


def _holm(first: Sequence[Interval | None], judging: Judging) -> list[float]:
    """Holm's levels for comparisons whose intervals at one look's level are ``first``."""
    return holm_levels([None if iv is None else iv.p_value for iv in first], _alpha(judging))


def against_baseline(summaries: Sequence[Summary], reference: Summary, judging: Judging) -> list[Summary]:
    """Every row compared with the baseline, Holm's step-down over the rows compared."""
    others = [s for s in summaries if s is not reference]
    first = [paired(s, reference, judging.figure, judging.level) for s in others]
    levels = dict(zip((s.variant.name for s in others), _holm(first, judging)))
    return [compare(s, reference, judging, levels.get(s.variant.name)) for s in summaries]


def with_increments(
    summaries: Sequence[Summary], found: Mapping[str, tuple[str, str]], judging: Judging
) -> list[Summary]:
    """The rows with their increment over their partner (``found``), Holm over the increments.

    The increments come from one fit over the rows compared (:func:`blocked_intervals`): the
    rounds are the blocks, the spread between runs is pooled over those rows.
    """
    by = {s.variant.name: s for s in summaries}
    pairs = [(name, partner) for name, (partner, _) in found.items()]
    compared = {name: by[name].values for pair in pairs for name in pair}
    first = blocked_intervals(compared, pairs, judging.level, judging.figure in HIGHER_IS_BETTER)
    levels = _holm(first, judging)
    intervals = {name: None if iv is None else iv.at(lv) for (name, _), iv, lv in zip(pairs, first, levels)}
    out = []
    for s in summaries:
        if s.variant.name not in found:
            out.append(s)
            continue
        partner, note = found[s.variant.name]
        interval = intervals[s.variant.name]
        judged = verdict(interval, judging.resolution) if s.ok_runs else None
        if s.ok_runs and not by[partner].ok_runs:
            judged = Verdict("undecided", f"{partner} has no successful run", False)
        out.append(
            evolve(s, previous=partner, increment=interval, increment_verdict=judged, increment_note=note)
        )
    return out


TRAINING = ("final_loss", "metric")


def changes_training(mine: Stats | None, theirs: Stats | None, tolerance: float) -> float | None:
    """How far ``mine`` is from ``theirs`` beyond the runs' spread and ``tolerance``, else None.

    The spread is the larger range (max - min) of the two rows' runs; a
    difference of the medians larger than it, and larger than ``tolerance``
    of ``theirs``, is more than run-to-run noise explains.
    """
    if mine is None or theirs is None:
        return None
    spread = max(mine.max - mine.min, theirs.max - theirs.min)
    gap = abs(mine.median - theirs.median)
    return gap if gap > spread and gap > tolerance * max(abs(theirs.median), 1e-12) else None


def learning(summaries: Sequence[Summary], judging: Judging) -> list[Summary]:
    """Each row's final loss and metric against the row before and the baseline, beyond their spread."""
    by = {s.variant.name: s for s in summaries}
    reference = next((s for s in summaries if s.is_baseline), None)
    out = []
    for s in summaries:
        found: list[str] = []
        others = [by[s.previous]] if s.previous is not None else []
        if reference is not None and reference is not s and reference not in others:
            others.append(reference)
        for other in others:
            for key in TRAINING:
                mine, theirs = s.figures.get(key), other.figures.get(key)
                if changes_training(mine, theirs, judging.tolerance) is not None:
                    assert mine is not None and theirs is not None
                    spread = max(mine.max - mine.min, theirs.max - theirs.min)
                    found.append(
                        f"{key.replace('_', ' ')} {mine.median:.4g} against {theirs.median:.4g} of "
                        f"{other.variant.name} (run-to-run spread {spread:.2g})"
                    )
        out.append(evolve(s, training=tuple(found)) if found else s)
    return out
