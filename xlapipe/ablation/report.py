"""Tables (console, Markdown, CSV) and a plot of an ablation's results."""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from xlapipe.ablation.results import FIGURES, Results, Stats, Summary

TABLE_FILE, CSV_FILE, PLOT_FILE = "ablation.md", "ablation.csv", "ablation.png"

LABELS = {
    "epoch_s": "time / epoch (s)",
    "wall_s": "time after warm-up (s)",
    "steps_per_s": "steps / s",
}


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


def rows(results: Results) -> list[list[str]]:
    """Header and one row per variant, in the shape of the original report."""
    fig = results.figure
    head = ["variant", LABELS.get(fig, fig) + " median [min-max]", "vs baseline",
            "speed-up", "compiles", "compiles after warm-up", "final loss", "metric", "runs"]
    out = [head]
    for s in results.summaries():
        name = s.variant.name + (" (baseline)" if s.is_baseline and s.variant.name != "baseline" else "")
        change = "-" if s.is_baseline else ("n/a" if s.change_pct is None else f"{s.change_pct:+.1f}%")
        speed = "1.00x" if s.is_baseline and s.speedup_x else (
            "n/a" if s.speedup_x is None else f"{s.speedup_x:.2f}x")
        out.append([name, _spread(s.figures.get(fig)), change, speed, _median(s, "compiles_total"),
                    _median(s, "compiles_after_warmup"), _median(s, "final_loss"),
                    _median(s, "metric"), s.runs])
    return out


def table(results: Results) -> str:
    """A fixed-width text table for the console, with a line on how to read it."""
    body = rows(results)
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n" + _legend(results) + "\n"


def _legend(results: Results) -> str:
    base = next((v for v in results.variants if v.name == results.baseline), None)
    shown = f"{results.baseline} = {base.pipeline!r}" if base is not None else results.baseline
    return (f"baseline: {shown}. vs baseline: change of the median {results.figure}; "
            f"speed-up: baseline / variant (above 1 is faster).")


def markdown(results: Results) -> str:
    """The table as Markdown, then each variant's pipeline and any errors."""
    body = rows(results)
    md = io.StringIO()
    md.write(f"# Ablation ({results.mode or 'variants'})\n\n")
    md.write("| " + " | ".join(body[0]) + " |\n")
    md.write("|" + "|".join("---" for _ in body[0]) + "|\n")
    for r in body[1:]:
        md.write("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n")
    md.write(f"\n{_legend(results)}\n\n## Variants\n\n")
    for s in results.summaries():
        note = f" ({s.variant.note})" if s.variant.note else ""
        md.write(f"- **{s.variant.name}**{note}: `{s.variant.pipeline!r}`\n")
    if results.refused:
        md.write("\n## Refused combinations\n\n")
        for r in results.refused:
            md.write(f"- {' + '.join(r.names) or '(none)'}: {r.reason}\n")
    errors = [(s.variant.name, *e) for s in results.summaries() for e in s.errors]
    if errors:
        md.write("\n## Failed runs\n\n")
        for name, repeat, status, error in errors:
            last = (error.strip().splitlines() or [""])[-1]
            md.write(f"- **{name}**, repeat {repeat}, {status}: {last}\n")
    return md.getvalue()


def write_csv(results: Results, path: str | os.PathLike) -> None:
    """One row per variant: names, statuses, comparison, and median/min/max/q1/q3 per figure."""
    summaries = results.summaries()
    keys = [k for k in FIGURES if any(k in s.figures for s in summaries)]
    keys += sorted({k for s in summaries for k in s.figures} - set(keys))
    head = ["variant", "is_baseline", "pipeline", "note", "runs_ok", "runs_failed", "change_pct", "speedup_x"]
    head += [f"{k}_{stat}" for k in keys for stat in ("median", "min", "max", "q1", "q3", "n")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for s in summaries:
            row = [s.variant.name, s.is_baseline, repr(s.variant.pipeline), s.variant.note,
                   s.statuses.get("ok", 0), sum(n for k, n in s.statuses.items() if k != "ok"),
                   "" if s.change_pct is None else s.change_pct, "" if s.speedup_x is None else s.speedup_x]
            for k in keys:
                st = s.figures.get(k)
                row += ["", "", "", "", "", 0] if st is None else [st.median, st.min, st.max, st.q1, st.q3, st.n]
            w.writerow(row)


def plot(results: Results, path: str | os.PathLike) -> None:
    """Time (median, min-max bars) and XLA compilations per variant, as a PNG (Agg, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summaries = results.summaries()
    names = [s.variant.name for s in summaries]
    ys = list(range(len(names)))[::-1]
    fig = Figure(figsize=(11, 1.2 + 0.45 * len(names)), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_c = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    colors = ["tab:gray" if s.is_baseline else "tab:blue" for s in summaries]

    def bars(ax, key: str, title: str, color=None, label=None, missing=" n/a") -> None:
        stats = [s.figures.get(key) for s in summaries]
        med = [st.median if st else 0.0 for st in stats]
        err = [[st.median - st.min if st else 0 for st in stats], [st.max - st.median if st else 0 for st in stats]]
        ax.barh(ys, med, xerr=err, color=color or colors, capsize=3, label=label)
        for y, st in zip(ys, stats):
            if st is None and missing:
                ax.text(0, y, missing, va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)

    bars(ax_t, results.figure, LABELS.get(results.figure, results.figure) + " (median, min-max)")
    base = next((s.figures.get(results.figure) for s in summaries if s.is_baseline), None)
    if base is not None:
        ax_t.axvline(base.median, color="tab:gray", linestyle="--", linewidth=1)
    title = "XLA compilations (median, min-max)"
    bars(ax_c, "compiles_total", title, color="tab:cyan", label="total", missing=" n/a (no XLA)")
    bars(ax_c, "compiles_after_warmup", title, color="tab:purple", label="after warm-up", missing="")
    ax_c.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.3 / len(names)), ncol=2)
    ax_t.set_yticks(ys, names, fontsize=8)
    fig.suptitle(f"Ablation ({results.mode or 'variants'}); baseline in gray: {results.baseline}", fontsize=11)
    fig.savefig(path, dpi=100)


def write_all(results: Results, out: str | os.PathLike) -> dict[str, Path]:
    """Write the Markdown table, the CSV and the plot into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / TABLE_FILE, "csv": out / CSV_FILE, "plot": out / PLOT_FILE}
    paths["markdown"].write_text(markdown(results))
    write_csv(results, paths["csv"])
    plot(results, paths["plot"])
    return paths
