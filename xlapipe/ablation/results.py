"""The results file (JSON lines, append only) and the per-variant statistics.

One line per finished variant-repeat, written the moment the run ends, so a
killed ablation loses at most the run in flight. A truncated last line (the
writer was killed mid-line) is skipped when reading and fenced off with a
newline before the next append.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xlapipe.ablation.variants import Variant
from xlapipe.metrics import json_safe
from xlapipe.pipeline import Pipeline

RESULTS_FILE = "results.jsonl"
STATUSES = ("ok", "error", "timeout")

# The figures the table, CSV and plot show, in this order (all report keys are kept).
FIGURES = (
    "epoch_s", "wall_s", "steps_per_s", "compiles_total", "compiles_after_warmup",
    "compile_s_total", "compile_s_after_warmup", "execute_s_after_warmup",
    "transfer_to_device_s_after_warmup", "wall_over_execute", "peak_rss_mb",
    "final_loss", "metric",
)


def append(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line and flush it to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(json_safe(dict(record)), sort_keys=True, allow_nan=False)
    with open(path, "ab") as f:
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":  # a killed writer left half a line: fence it off
                    f.write(b"\n")
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def load(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete record in ``path`` (none if it does not exist); bad lines are skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict) and "variant" in record and "repeat" in record:
            records.append(record)
        else:
            bad += 1
    if bad:
        warnings.warn(f"{path}: skipped {bad} unreadable line(s) (a run killed mid-write?)", stacklevel=2)
    return records


def config_key(target: str, args: Sequence[str], kwargs: Mapping[str, Any] | None = None) -> str:
    """What must match (besides variant and repeat) for a recorded run to count as done."""
    return json.dumps({"target": target, "args": list(args), "kwargs": dict(kwargs or {})}, sort_keys=True)


def record_key(record: Mapping[str, Any]) -> tuple[str, str, int]:
    variant_key = json.dumps([record["variant"], record.get("pipeline_description", [])], sort_keys=True)
    return variant_key, record.get("config", ""), int(record["repeat"])


@frozen
class Stats:
    """Median and spread of one figure over a variant's successful repeats."""

    n: int
    median: float
    min: float
    max: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats | None:
        xs = sorted(float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v))
        if not xs:
            return None
        q1, q3 = (statistics.quantiles(xs, n=4, method="inclusive")[::2] if len(xs) > 1 else (xs[0], xs[0]))
        return cls(len(xs), statistics.median(xs), xs[0], xs[-1], q1, q3)


@frozen
class Summary:
    """One variant's runs, reduced: statuses, figures, comparison with the baseline."""

    variant: Variant
    is_baseline: bool
    statuses: dict[str, int]
    figures: dict[str, Stats]
    errors: tuple[tuple[int, str, str], ...]  # (repeat, status, error text) of failed runs
    change_pct: float | None = None  # (variant - baseline) / baseline, on the time figure
    speedup_x: float | None = None   # baseline / variant: above 1 is faster than the baseline

    @property
    def runs(self) -> str:
        total = sum(self.statuses.values())
        if not total:
            return "not run"
        parts = [f"{self.statuses.get('ok', 0)}/{total} ok"]
        parts += [f"{n} {s}" for s, n in sorted(self.statuses.items()) if s != "ok" and n]
        return ", ".join(parts)


@frozen
class Results:
    """An ablation's variants, its baseline, and every record that belongs to it."""

    variants: tuple[Variant, ...] = field(converter=tuple)
    baseline: str
    records: tuple[dict[str, Any], ...] = field(converter=tuple)
    figure: str = "epoch_s"
    mode: str = ""
    refused: tuple[Any, ...] = ()
    out: str | None = None

    def runs_of(self, variant: Variant) -> list[dict[str, Any]]:
        """The latest record of each repeat of ``variant`` (a retry replaces a failure)."""
        latest: dict[int, dict[str, Any]] = {}
        for r in self.records:
            if r["variant"] == variant.name and r.get("pipeline_description") == variant.description:
                prior = latest.get(int(r["repeat"]))
                if prior is None or prior.get("status") != "ok" or r.get("status") == "ok":
                    latest[int(r["repeat"])] = r
        return [latest[k] for k in sorted(latest)]

    def summaries(self) -> list[Summary]:
        """One :class:`Summary` per variant, in plan order."""
        out = []
        for v in self.variants:
            runs = self.runs_of(v)
            statuses: dict[str, int] = {}
            for r in runs:
                statuses[r.get("status", "error")] = statuses.get(r.get("status", "error"), 0) + 1
            reports = [r.get("report") or {} for r in runs if r.get("status") == "ok"]
            keys = sorted({k for rep in reports for k, val in rep.items() if isinstance(val, (int, float))
                           and not isinstance(val, bool)})
            figures = {k: s for k in keys if (s := Stats.of(rep.get(k) for rep in reports)) is not None}
            errors = tuple((int(r["repeat"]), r.get("status", "error"), r.get("error") or "")
                           for r in runs if r.get("status") != "ok")
            out.append(Summary(v, v.name == self.baseline, statuses, figures, errors))
        base = next((s for s in out if s.is_baseline), None)
        ref = base.figures.get(self.figure) if base else None
        if ref is None or ref.median <= 0:
            return out
        compared = []
        for s in out:
            mine = s.figures.get(self.figure)
            if mine is None or mine.median <= 0:
                compared.append(s)
                continue
            compared.append(Summary(
                s.variant, s.is_baseline, s.statuses, s.figures, s.errors,
                change_pct=100.0 * (mine.median - ref.median) / ref.median,
                speedup_x=ref.median / mine.median,
            ))
        return compared

    @property
    def ok(self) -> bool:
        """True when every run recorded for the plan succeeded."""
        return all(set(s.statuses) <= {"ok"} and s.statuses for s in self.summaries())

    def __getitem__(self, name: str) -> Summary:
        for s in self.summaries():
            if s.variant.name == name:
                return s
        raise KeyError(f"no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    def table(self) -> str:
        """The console table (variant, time, change against the baseline)."""
        from xlapipe.ablation.report import table

        return table(self)

    def write(self, out: str | os.PathLike | None = None) -> dict[str, Path]:
        """Write the Markdown table, CSV and plot into ``out`` (default: where the results are)."""
        from xlapipe.ablation.report import write_all

        where = out or self.out
        if where is None:
            raise ValueError("give an output folder: results.write('results/ablation')")
        return write_all(self, where)

    @classmethod
    def load(cls, path: str | os.PathLike, figure: str = "epoch_s") -> Results:
        """Rebuild results from a results file (variants in first-seen order, latest config)."""
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        records = load(path)
        if not records:
            raise ValueError(f"{path} holds no results; run `xlapipe ablate ... --out {path.parent}` first")
        last = records[-1]
        mine = [r for r in records if r.get("config") == last.get("config")]
        variants: dict[str, Variant] = {}
        for r in sorted(mine, key=lambda r: r.get("variant_index", 0)):
            key = json.dumps([r["variant"], r.get("pipeline_description", [])], sort_keys=True)
            if key not in variants:
                pipeline = Pipeline.from_description(r.get("pipeline_description", []))
                variants[key] = Variant(r["variant"], pipeline, r.get("note", ""))
        names = [v.name for v in variants.values()]
        baseline = last.get("baseline") if last.get("baseline") in names else names[0]
        return cls(variants.values(), baseline, mine, figure, last.get("mode", ""), (), str(path.parent))
