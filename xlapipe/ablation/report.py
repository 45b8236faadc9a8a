"""Tables (console, Markdown, CSV) and plots of an :class:`~xlapipe.ablation.analysis.Analysis`."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from xlapipe.ablation.analysis import (
    ALTERNATIVES,
    FIGURES,
    PHASE_LABELS,
    PHASES,
    Analysis,
    Summary,
    paired,
    twin_of,
)
from xlapipe.ablation.stats import Interval, Stats

TABLE_FILE, CSV_FILE, PLOT_FILE, PHASES_FILE = "ablation.md", "ablation.csv", "ablation.png", "phases.png"
RECOMMENDED_JSON, RECOMMENDED_PY = "recommended.json", "recommended.py"

LABELS = {
    "epoch_s": "time / epoch (s)",
    "wall_s": "time after warm-up (s)",
    "steps_per_s": "steps / s",
    **PHASE_LABELS,
}


class HasAnalysis(Protocol):
    def analysis(self) -> Analysis: ...


def as_analysis(results: Analysis | HasAnalysis) -> Analysis:
    """An :class:`Analysis`, or what ``results.analysis()`` returns (e.g. for ablation ``Results``)."""
    return results if isinstance(results, Analysis) else results.analysis()


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _spread(stats: Stats | None) -> str:
    if stats is None:
        return "n/a"
    if stats.n == 1:
        return _num(stats.median)
    return f"{_num(stats.median)} [{_num(stats.min)}-{_num(stats.max)}]"


def _median(s: Summary, key: str) -> str:
    stats = s.figures.get(key)
    return "n/a" if stats is None else _num(stats.median, 4)


def _interval(s: Summary) -> str:
    iv = s.interval
    if s.is_baseline or iv is None:
        return "-" if s.is_baseline else "n/a"
    if not iv.decided:
        return f"n/a ({iv.n} paired)"
    return f"{iv.low:.3g}x-{iv.high:.3g}x"


def _verdict(s: Summary) -> str:
    if s.is_baseline:
        return "reference"
    if s.verdict is None:
        return "n/a"
    return s.verdict.word if s.verdict.word == "undecided" else str(s.verdict)


def percent(x: float) -> str:
    """A speed-up factor as a percentage faster (1.04 -> "4%") or slower (0.8 -> "25%"); from 2x, "2.5x"."""
    factor = x if x >= 1 else 1 / x if x > 0 else float("inf")
    if factor >= 2:
        return f"{factor:.3g}x"
    change = 100 * (factor - 1)
    return f"{change:.0f}%" if change >= 10 else f"{change:.1g}%" if change < 1 else f"{change:.1f}%"


def _shown(iv: Interval | None) -> str:
    if iv is None:
        return "n/a"
    if not iv.decided:
        return f"{iv.estimate:.3g}x ({iv.n} paired)"
    return f"{iv.estimate:.3g}x [{iv.low:.3g}-{iv.high:.3g}]"


def undecided_detail(iv: Interval | None, resolution: float) -> str:
    """What an undecided comparison could have seen: its detectable effect and the rounds to decide."""
    if iv is None or iv.detectable() is None:
        return ""
    found = iv.detectable()
    rounds = iv.rounds_to_decide(resolution)
    assert found is not None and rounds is not None
    need = f"about {rounds} paired rounds" if rounds <= 10_000 else "more than 10,000 paired rounds"
    return f"could detect {percent(1 + found)} or more (80% power); {need} would decide ±{resolution:.0%}"


def _decision(s: Summary, analysis: Analysis, increment: bool) -> str:
    judged = s.increment_verdict if increment else s.verdict
    iv = s.increment if increment else s.interval
    if judged is None:
        return s.failed and f"failed: {s.failed}" or "n/a"
    text = judged.word if judged.word == "undecided" else str(judged)
    if not judged.resolved:
        more = undecided_detail(iv, analysis.judging.resolution)
        text += f"; {more}" if more else ""
    if increment and s.training:
        text += "; CHANGES TRAINING"
    return text


def rows(analysis: Analysis) -> list[list[str]]:
    """Header and one row per variant, in the shape of the original report.

    When rows are compared with one another (add-one: the row before;
    leave-one-out: the full pipeline; the A/A pair), that comparison is the
    first verdict: the row compared with, the speed-up [interval], the verdict.
    """
    analysis = as_analysis(analysis)
    fig = analysis.figure
    first = analysis.increments
    head = [
        "variant",
        LABELS.get(fig, fig) + " median [min-max]",
        *(["against", "speed-up [interval]", "verdict"] if first else []),
        "vs baseline",
        "speed-up",
        f"{analysis.judging.confidence:.0%} interval",
        "verdict" if not first else "verdict vs baseline",
        "compiles",
        "compile s",
        "compiles after warm-up",
        "final loss",
        "metric",
        "runs",
    ]
    out = [head]
    for s in analysis.summaries:
        name = s.variant.name + (" (baseline)" if s.is_baseline and s.variant.name != "baseline" else "")
        change = "-" if s.is_baseline else ("n/a" if s.change_pct is None else f"{s.change_pct:+.1f}%")
        speed = (
            "1.00x"
            if s.is_baseline and s.speedup_x
            else ("n/a" if s.speedup_x is None else f"{s.speedup_x:.2f}x")
        )
        against = []
        if first:
            if s.previous is None:
                against = ["-", "-", "failed: " + s.failed if s.failed else "-"]
            else:
                against = [s.previous, _shown(s.increment), _decision(s, analysis, True)]
        out.append(
            [
                name,
                _spread(s.figures.get(fig)),
                *against,
                change,
                speed,
                _interval(s),
                _verdict(s) if s.verdict is None or s.verdict.resolved else _decision(s, analysis, False),
                _median(s, "compiles_total"),
                _median(s, "compile_s_total"),
                _median(s, "compiles_after_warmup"),
                _median(s, "final_loss"),
                _median(s, "metric"),
                s.runs,
            ]
        )
    return out


def _fixed_width(body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def sentences(analysis: Analysis) -> list[str]:
    """One sentence per row compared with another: what it adds ("+b: 4% faster [2-6%] than +a")."""
    analysis = as_analysis(analysis)
    out = []
    resolution = analysis.judging.resolution
    for s in analysis.summaries:
        if s.previous is None:
            if s.failed and analysis.increments:
                out.append(
                    f"{s.variant.name}: failed ({s.failed}); the rows after it are compared without it."
                )
            continue
        iv, judged, name, prev = s.increment, s.increment_verdict, s.variant.name, s.previous
        if twin_of(s) is not None:
            name, what = f"{name} (A/A, the noise floor)", "its twin"
        else:
            what = prev
        if s.failed:
            text = f"{name}: failed ({s.failed}); not compared."
        elif judged is None or iv is None or judged.word == "undecided" or iv.low is None or iv.high is None:
            why = judged.detail if judged is not None else "no paired round"
            text = f"{name}: undecided against {what} ({why})."
        elif judged.word in ("faster", "slower"):
            lo, hi = (iv.low, iv.high) if judged.word == "faster" else (1 / iv.high, 1 / iv.low)
            est = iv.estimate if judged.word == "faster" else 1 / iv.estimate
            ends = (f"{lo:.3g}x", f"{hi:.3g}x") if hi >= 2 else (percent(lo), percent(hi))
            shown = f"{est:.3g}x" if hi >= 2 else percent(est)
            text = f"{name}: {shown} {judged.word} [{ends[0]}-{ends[1]}] than {what}."
        else:
            reach = iv.resolution or 0.0
            span = f"within ±{percent(1 + reach)}" if reach <= 1 else f"{iv.low:.3g}x-{iv.high:.3g}x"
            text = f"{name}: no detectable difference from {what} ({span})"
            if not judged.resolved:
                text += f"; {undecided_detail(iv, resolution)}"
            text += "."
        if s.increment_note and twin_of(s) is None:
            text = text[:-1] + f" ({s.increment_note})."
        if s.training:
            text += " Changes training: " + "; ".join(s.training) + "."
        if twin_of(s) is not None and judged is not None and judged.word in ("faster", "slower"):
            text += (
                " The same pipeline came out different: the runs vary more than their intervals say "
                "(drift, a busy machine); read the table with caution."
            )
        out.append(text)
    return out


def holm_note(analysis: Analysis) -> str:
    """How the table's several comparisons share the confidence (Holm's step-down), in a sentence."""
    judging = analysis.judging
    first = sum(1 for s in analysis.summaries if s.previous is not None)
    second = sum(1 for s in analysis.summaries if not s.is_baseline) if analysis.reference else 0
    parts = [f"{n} {what}" for n, what in ((first, "increments"), (second, "rows vs the baseline")) if n]
    if not parts:
        return ""
    return (
        f"Several rows: Holm's step-down over the {' and over the '.join(parts)} (each column a family; "
        f"an interval is shown at its Holm step's level), within each look's {1 - judging.level:.3g} error, "
        f"so that each column's verdicts hold {judging.confidence:.0%} together."
    )


def noise_note(analysis: Analysis) -> str:
    """The noise floor: how precise a run's median step is, and how much runs of one pipeline differ."""
    ses = [s.figures["step_s_rel_se"].median for s in analysis.summaries if "step_s_rel_se" in s.figures]
    steps = [s.figures["measured_steps"].median for s in analysis.summaries if "measured_steps" in s.figures]
    parts = []
    if ses and steps:
        se, n = statistics.median(ses), statistics.median(steps)
        need = math.ceil(n * (se / 0.01) ** 2) if se > 0 else int(n)
        parts.append(
            f"Within a run, the median step of {n:.0f} measured steps is known to ±{100 * se:.2g}% (its standard "
            f"error, the median over the rows); ±1% would take about {need} steps after the warm-up."
        )
    pooled = next(
        (s.increment for s in analysis.summaries if s.increment is not None and s.increment.pooled), None
    )
    if pooled is not None and pooled.sd is not None:
        parts.append(
            f"Between runs, pooled over the {pooled.pooled} rows compared ({pooled.dof:.0f} degrees of freedom), "
            f"the ratio of two runs of one pipeline varies by {100 * (math.exp(pooled.sd) - 1):.2g}% "
            "(standard deviation): the noise floor of every increment."
        )
    for s in analysis.summaries:
        twin = twin_of(s)
        own = None if twin is None else paired(s, analysis[twin], analysis.figure, analysis.judging.level)
        if own is not None and own.sd is not None:
            parts.append(f"The A/A pair on its own ({own.n} rounds): {100 * (math.exp(own.sd) - 1):.2g}%.")
            if pooled is not None and s.increment is not None and not s.increment.pooled:
                parts.append(
                    "That is above the pooled figure by more than chance (an F test at 5%): the rows do not "
                    "share one spread here, so the A/A interval is the pair's own and the pooled intervals "
                    "of the other rows rest on an assumption these runs do not bear out."
                )
    return " ".join(parts)


OUTLIER = 0.10  # a machine this much slower or faster than the fleet's median is named as an outlier


def _machines(analysis: Analysis) -> str:
    """Where the runs ran; with several machines, each one's speed and the outliers."""
    machines = analysis.machines
    devices = ", ".join(analysis.devices) or "not recorded"
    if not machines:
        return ""
    text = (
        f"Runs on {len(machines)} machine(s) ({', '.join(machines)}), PJRT device {devices}; "
        "a block is a round on one machine."
    )
    speeds = analysis.machine_speeds()
    if len(speeds) < 2:
        return text
    median = statistics.median(speeds.values())
    shown = ", ".join(f"{m} {t:.2f}x" for m, t in speeds.items())
    text += f" Per machine, the time of the same work against the fleet's mean: {shown}."
    odd = [m for m, t in speeds.items() if abs(t / median - 1) > OUTLIER]
    if odd:
        text += (
            f" Outlier(s), more than {OUTLIER:.0%} from the median machine: {', '.join(odd)}; each round is "
            "compared on its own machine, so this does not bias the verdicts, but check the machine."
        )
    return text


def table(analysis: Analysis) -> str:
    """A fixed-width text table for the console, with how to read it and what stayed unresolved."""
    analysis = as_analysis(analysis)
    lines = _fixed_width(rows(analysis))
    lines += sentences(analysis)
    lines.append(_legend(analysis))
    lines += [line for line in (holm_note(analysis), noise_note(analysis), _machines(analysis)) if line]
    lines += _unresolved(analysis)
    lines += analysis.notes
    if analysis.effects is not None:
        lines += ["", *effect_lines(analysis)]
    if analysis.recommendation is not None:
        lines += ["", analysis.recommendation.text()]
    return "\n".join(lines) + "\n"


def _legend(analysis: Analysis) -> str:
    ref, judging = analysis.reference, analysis.judging
    shown = f"{analysis.baseline} = {ref.variant.pipeline!r}" if ref is not None else analysis.baseline
    looks = (
        f"; a row is looked at {judging.looks} times (one per round from round {max(judging.repeats, 2)}), "
        f"each look with {1 - judging.level:.3g} of the {1 - judging.confidence:.0%} error"
        if judging.looks > 1
        else ""
    )
    first = (
        "against: the row compared with first (add-one: the row before; leave-one-out: the full pipeline; "
        "an A/A row: its twin), its speed-up over it [interval] and the verdict; the interval from one "
        "least-squares fit of the log figure on row and round over the rows compared (the rounds are the "
        "blocks, the spread between runs pooled over the rows: the analysis of a randomised complete block "
        "design), Student's t with that fit's degrees of freedom. "
        if analysis.increments
        else ""
    )
    return (
        f"baseline: {shown}. {first}vs baseline: change of the median {analysis.figure}; speed-up: "
        f"baseline / variant (above 1 is faster); interval: the speed-up paired by round (the block: a round "
        f"on one machine, each round in its own random order), a Student-t interval of the mean log ratio "
        f"over the paired rounds{looks}."
    )


def _unresolved(analysis: Analysis) -> list[str]:
    names = analysis.unresolved
    if not names:
        return []
    groups: dict[str, list[str]] = {}
    for s in analysis.summaries:
        if s.variant.name in names:
            judged = s.decisive
            why = str(judged) if judged is None or s.previous is None else f"{judged} against {s.previous}"
            groups.setdefault(why, []).append(s.variant.name)
    details = "; ".join(f"{', '.join(group)}: {why}" for why, group in groups.items())
    return [f"Unresolved (neither excluding 1.0 nor within ±{analysis.judging.resolution:.0%}): {details}"]


def effect_lines(analysis: Analysis) -> list[str]:
    """The factorial's main effects and interactions, in words."""
    fit = analysis.effects
    if fit is None:
        raise ValueError("effect_lines needs an analysis of a factorial ablation (one with fitted effects)")
    out = [
        f"Effects on {analysis.figure} (log scale, {fit.runs} runs, {fit.residual_df} residual degrees "
        f"of freedom; speed-up factors, {fit.confidence:.0%} intervals):"
    ]
    if not fit.effects:
        out.append("  not enough successful runs to fit the effects")
    for e in fit.effects:
        if e.estimate != e.estimate:  # NaN: not estimable
            out.append(f"  {' x '.join(e.names)}: {e.note}")
            continue
        span = "" if e.low is None else f" [{e.low:.3g}x-{e.high:.3g}x]"
        if e.kind == "main":
            out.append(f"  {e.names[0]} alone: {e.estimate:.3g}x{span}{_sig(e.significant, 'effect')}")
        else:
            a, b = e.names
            out.append(
                f"  {a} with {b}: a further {e.estimate:.3g}x{span}{_sig(e.significant, 'interaction')}"
            )
        if e.note and e.low is None:
            out[-1] += f" ({e.note})"
    if analysis.design:
        out.append(f"  Design: {analysis.design}")
    return out


def _sig(significant: bool | None, what: str) -> str:
    if significant is None:
        return ""
    return "" if significant else f"; no detectable {what}"


def _present(analysis: Analysis, keys: Sequence[str]) -> list[str]:
    """The figures among ``keys`` that some variant reports, in ``keys``' order."""
    return [k for k in keys if any(k in s.figures for s in analysis.summaries)]


def _phase_rows(analysis: Analysis) -> list[list[str]]:
    present = _present(analysis, PHASES)
    if not present:
        return []
    head = ["variant", *(PHASE_LABELS[k] + " median [min-max]" for k in present)]
    body = [[s.variant.name, *(_spread(s.figures.get(k)) for k in present)] for s in analysis.summaries]
    return [head, *body]


def _md_table(body: list[list[str]]) -> str:
    md = io.StringIO()
    md.write("| " + " | ".join(body[0]) + " |\n")
    md.write("|" + "|".join("---" for _ in body[0]) + "|\n")
    for r in body[1:]:
        md.write("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n")
    return md.getvalue()


def markdown(analysis: Analysis) -> str:
    """The table as Markdown, then phases, effects, the recommendation, pipelines and errors."""
    analysis = as_analysis(analysis)
    md = io.StringIO()
    md.write(f"# Ablation ({analysis.mode or 'variants'})\n\n")
    md.write(_md_table(rows(analysis)))
    said = sentences(analysis)
    if said:
        md.write("\n" + "".join(f"- {line}\n" for line in said))
    md.write(f"\n{_legend(analysis)}\n")
    for line in (holm_note(analysis), noise_note(analysis), _machines(analysis)):
        if line:
            md.write(f"\n{line}\n")
    for line in _unresolved(analysis):
        md.write(f"\n**{line}**\n")
    for note in analysis.notes:
        md.write(f"\n{note}\n")
    phases = _phase_rows(analysis)
    if phases:
        goal = analysis.judging.target_metric
        target = f" (target metric {goal})" if goal is not None else ""
        md.write(
            f"\n## Phases{target}\n\nTime to the first update includes compiling it; the steady-state "
            "step is the median step after the run's warm-up (found per run: up to its last compilation).\n\n"
            + _md_table(phases)
        )
    if analysis.effects is not None:
        md.write("\n## Effects\n\n" + "\n".join(effect_lines(analysis)) + "\n")
    rec = analysis.recommendation
    if rec is not None:
        md.write(f"\n## Recommended pipeline: {rec.variant}\n\n{rec.reason}.\n")
        if rec.alternatives:
            md.write(f"\n{ALTERNATIVES}{', '.join(rec.alternatives)}.\n")
        md.write(f"\n```python\n{rec.python}\n```\n\n```json\n{rec.json}\n```\n")
        if rec.excluded:
            md.write("\nNot candidates:\n\n" + "".join(f"- **{n}**: {why}\n" for n, why in rec.excluded))
    md.write("\n## Variants\n\n")
    for s in analysis.summaries:
        note = f" ({s.variant.note})" if s.variant.note else ""
        md.write(f"- **{s.variant.name}**{note}: `{s.variant.pipeline!r}`\n")
    if analysis.refused:
        md.write("\n## Refused combinations\n\n")
        for r in analysis.refused:
            md.write(f"- {' + '.join(r.names) or '(none)'}: {r.reason}\n")
    errors = [(s.variant.name, *e) for s in analysis.summaries for e in s.errors]
    if errors:
        md.write("\n## Failed runs\n\n")
        for name, repeat, status, error in errors:
            md.write(f"- **{name}**, repeat {repeat}, {status}: {headline(error)}\n")
    return md.getvalue()


def headline(error: str) -> str:
    """The line of a failed run's error to show: the runner's own verdict (killed, timed out), else the last."""
    lines = error.strip().splitlines() or [""]
    return lines[0] if lines[0].startswith(("killed by", "timed out")) else lines[-1]


def write_csv(analysis: Analysis, path: str | os.PathLike) -> None:
    """One row per variant: names, statuses, comparison, verdict, median/min/max/q1/q3/n per figure."""
    analysis = as_analysis(analysis)
    summaries = analysis.summaries
    keys = _present(analysis, FIGURES)
    keys += sorted({k for s in summaries for k in s.figures} - set(keys))
    head = [
        "variant",
        "is_baseline",
        "pipeline",
        "note",
        "runs_ok",
        "runs_failed",
        "change_pct",
        "speedup_x",
        "speedup_low",
        "speedup_high",
        "interval_level",
        "paired_repeats",
        "verdict",
        "resolved",
        "compared_with",
        "increment_x",
        "increment_low",
        "increment_high",
        "increment_level",
        "increment_verdict",
        "increment_resolved",
        "increment_note",
        "changes_training",
    ]
    head += [f"{k}_{stat}" for k in keys for stat in ("median", "min", "max", "q1", "q3", "n")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for s in summaries:
            iv = s.interval
            row = [
                s.variant.name,
                s.is_baseline,
                repr(s.variant.pipeline),
                s.variant.note,
                s.ok_runs,
                sum(n for k, n in s.statuses.items() if k != "ok"),
                _blank(s.change_pct),
                _blank(s.speedup_x),
                _blank(None if iv is None else iv.low),
                _blank(None if iv is None else iv.high),
                _blank(None if iv is None or not iv.decided else iv.level),
                0 if iv is None else iv.n,
                "" if s.verdict is None else str(s.verdict),
                "" if s.verdict is None else s.verdict.resolved,
                s.previous or "",
                _blank(None if s.increment is None else s.increment.estimate),
                _blank(None if s.increment is None else s.increment.low),
                _blank(None if s.increment is None else s.increment.high),
                _blank(None if s.increment is None or not s.increment.decided else s.increment.level),
                "" if s.increment_verdict is None else str(s.increment_verdict),
                "" if s.increment_verdict is None else s.increment_verdict.resolved,
                s.increment_note,
                "; ".join(s.training),
            ]
            for k in keys:
                st = s.figures.get(k)
                row += (
                    ["", "", "", "", "", 0] if st is None else [st.median, st.min, st.max, st.q1, st.q3, st.n]
                )
            w.writerow(row)


def _blank(value: float | None) -> object:
    return "" if value is None else value


def _figure(rows_: int, cols: int, width: float = 11) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 1.4 + 0.45 * rows_), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, cols, sharey=True, squeeze=False)[0]


def _bars(
    ax: Any,
    summaries: Sequence[Summary],
    ys: Sequence[float],
    key: str,
    title: str,
    color: str = "tab:blue",
    label: str | None = None,
    missing: str = " n/a",
) -> None:
    stats = [s.figures.get(key) for s in summaries]
    med = [st.median if st else 0.0 for st in stats]
    err = [
        [st.median - st.min if st else 0 for st in stats],
        [st.max - st.median if st else 0 for st in stats],
    ]
    colors = (
        color
        if isinstance(color, str) and label
        else ["tab:gray" if s.is_baseline else color for s in summaries]
    )
    ax.barh(ys, med, xerr=err, color=colors, capsize=3, label=label)
    for y, st in zip(ys, stats):
        if st is None and missing:
            ax.text(0, y, missing, va="center", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _speedups(ax: Any, summaries: Sequence[Summary], ys: Sequence[int], increments: bool) -> None:
    """Each row's speed-up with its interval: over the baseline, or (``increments``) over its partner."""
    for y, s in zip(ys, summaries):
        iv = s.increment if increments else s.interval
        judged = s.increment_verdict if increments else s.verdict
        if (s.is_baseline and not increments) or (increments and s.previous is None):
            if s.is_baseline or not increments:
                ax.plot([1.0], [y], "s", color="tab:gray")
            continue
        if iv is None:
            continue
        color = {"faster": "tab:green", "slower": "tab:red"}.get(judged.word if judged else "", "tab:blue")
        if iv.decided:
            assert iv.low is not None and iv.high is not None  # decided: both ends
            ax.errorbar(
                [iv.estimate],
                [y],
                xerr=[[iv.estimate - iv.low], [iv.high - iv.estimate]],
                fmt="o",
                color=color,
                capsize=3,
            )
        else:
            ax.plot([iv.estimate], [y], "o", mfc="none", color=color)
            ax.text(iv.estimate, y + 0.25, f"{iv.n} paired: no interval", fontsize=7, ha="center")
    ax.axvline(1.0, color="tab:gray", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    from matplotlib.ticker import LogFormatter  # plain tick labels ("2", "0.5"), not 2×10^0

    ax.xaxis.set_major_formatter(LogFormatter())
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.grid(axis="x", alpha=0.3, which="both")


def plot(analysis: Analysis, path: str | os.PathLike) -> None:
    """Per row: the figure (median, min-max bars), the increment with its interval (when rows are
    compared with one another), the speed-up over the baseline with its interval, XLA compilations (PNG)."""
    analysis = as_analysis(analysis)
    summaries = analysis.summaries
    names = [s.variant.name for s in summaries]
    ys = list(range(len(names)))[::-1]
    first = analysis.increments
    fig, axes = _figure(len(names), 4 if first else 3, width=18 if first else 14)
    ax_t, ax_i, ax_s, ax_c = (
        (axes[0], axes[1], axes[2], axes[3]) if first else (axes[1], None, axes[0], axes[2])
    )
    level = f"{analysis.judging.confidence:.0%} interval"
    _speedups(ax_s, summaries, ys, increments=False)
    ax_s.set_title(f"speed-up vs {analysis.baseline} ({level})", fontsize=10)
    if ax_i is not None:
        _speedups(ax_i, summaries, ys, increments=True)
        ax_i.set_title(f"increment: speed-up over the row compared with ({level})", fontsize=10)
    _bars(
        ax_t,
        summaries,
        ys,
        analysis.figure,
        LABELS.get(analysis.figure, analysis.figure) + " (median, min-max)",
    )
    base = None if analysis.reference is None else analysis.reference.figures.get(analysis.figure)
    if base is not None:
        ax_t.axvline(base.median, color="tab:gray", linestyle="--", linewidth=1)
    title = "XLA compilations (median, min-max)"
    _bars(
        ax_c, summaries, ys, "compiles_total", title, color="tab:cyan", label="total", missing=" n/a (no XLA)"
    )
    _bars(
        ax_c,
        summaries,
        ys,
        "compiles_after_warmup",
        title,
        color="tab:purple",
        label="after warm-up",
        missing="",
    )
    ax_c.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.3 / len(names)), ncol=2)
    axes[0].set_yticks(ys, names, fontsize=8)
    fig.suptitle(
        f"Ablation ({analysis.mode or 'variants'}); baseline in gray: {analysis.baseline}", fontsize=11
    )
    fig.savefig(path, dpi=100)


def plot_phases(analysis: Analysis, path: str | os.PathLike) -> bool:
    """One panel per phase reported (first update, steady step, evaluation, time to target); False if none."""
    analysis = as_analysis(analysis)
    summaries = analysis.summaries
    present = _present(analysis, PHASES)
    if not present:
        return False
    names = [s.variant.name for s in summaries]
    ys = list(range(len(names)))[::-1]
    fig, axes = _figure(len(names), len(present), width=3.6 * len(present) + 3)
    for ax, key in zip(axes, present):
        goal = analysis.judging.target_metric
        title = PHASE_LABELS[key] + (f"\n(target {goal})" if key == "time_to_target_s" else "")
        missing = " not reached" if key == "time_to_target_s" else " n/a"
        _bars(ax, summaries, ys, key, title, missing=missing)
    axes[0].set_yticks(ys, names, fontsize=8)
    fig.suptitle("Where the time goes, per variant (median, min-max; baseline in gray)", fontsize=11)
    fig.savefig(path, dpi=100)
    return True


def write_all(analysis: Analysis, out: str | os.PathLike) -> dict[str, Path]:
    """Write the Markdown, CSV, plots and the recommended pipeline into ``out``; return their paths."""
    analysis = as_analysis(analysis)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / TABLE_FILE, "csv": out / CSV_FILE, "plot": out / PLOT_FILE}
    paths["markdown"].write_text(markdown(analysis))
    write_csv(analysis, paths["csv"])
    plot(analysis, paths["plot"])
    if plot_phases(analysis, out / PHASES_FILE):
        paths["phases"] = out / PHASES_FILE
    else:
        (out / PHASES_FILE).unlink(missing_ok=True)  # not left over from an earlier analysis
    rec = analysis.recommendation
    if rec is None:
        for name in (RECOMMENDED_JSON, RECOMMENDED_PY):
            (out / name).unlink(missing_ok=True)
    else:
        paths["recommended_json"] = out / RECOMMENDED_JSON
        paths["recommended_py"] = out / RECOMMENDED_PY
        paths["recommended_json"].write_text(json.dumps(rec.pipeline.describe(), indent=1) + "\n")
        paths["recommended_py"].write_text(f"# {rec.variant}: {rec.reason}\n{rec.python}\n")
    return paths
