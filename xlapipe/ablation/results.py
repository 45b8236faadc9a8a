"""The results file (JSON lines, append only) and :class:`Results`, an ablation's records.

One line per finished variant-repeat, written the moment the run ends, so a
killed ablation loses at most the run in flight. A truncated last line (the
writer was killed mid-line) is skipped when reading and fenced off with a
newline before the next append. :meth:`Results.analysis` says what the
records mean (see :mod:`xlapipe.ablation.analysis`); the reports render it.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import evolve, field, frozen

from xlapipe._convert import records as records_tuple
from xlapipe._convert import strs
from xlapipe.ablation import report
from xlapipe.ablation.analysis import FIGURES, Analysis, Summary, analyse, check_figure, run_figures
from xlapipe.ablation.options import Judging
from xlapipe.ablation.recommend import Recommendation, recommend
from xlapipe.ablation.variants import Refused, Variant, variant_tuple
from xlapipe.metrics import json_safe
from xlapipe.pipeline import Pipeline

RESULTS_FILE = "results.jsonl"
STATUSES = ("ok", "error", "timeout")
FORMAT = 2  # records since the median step, the random order and the machine; before: no "format"
PREVIOUS_EDITION = (
    "read as the previous edition's records (before format 2): a run's step_s is the mean step after "
    "a fixed warm-up, recompilations included, and each round ran the variants in the plan's order"
)


def edition(records: Sequence[Mapping[str, Any]]) -> int | None:
    """The format of ``records`` (1: the previous edition's), or None when they mix editions."""
    formats = {int(r.get("format", 1)) if isinstance(r.get("format", 1), int) else -1 for r in records}
    if len(formats) > 1 or -1 in formats:
        return None
    return formats.pop() if formats else FORMAT


def check_edition(records: Sequence[Mapping[str, Any]], path: str | os.PathLike, resuming: bool) -> int:
    """The records' format, or a ValueError when they cannot be read as one (or resumed).

    A resumed ablation adds runs of this edition: runs of another edition for
    the same target would be compared with them though measured otherwise.
    """
    found = edition(records)
    if found is not None and found > FORMAT:
        raise ValueError(
            f"{path} was written by a newer xlapipe (results format {found}, this one reads up to "
            f"{FORMAT}); upgrade xlapipe to read it"
        )
    if found is None or (resuming and found != FORMAT):
        kinds = sorted({str(r.get("format", 1)) for r in records})
        raise ValueError(
            f"{path} holds runs of this target from a previous edition of `xlapipe ablate` (results format "
            f"{', '.join(kinds)}; this one writes {FORMAT}): their step time is the mean after a fixed "
            "warm-up, not the median after the warm-up each run shows, so the two cannot be compared. "
            "Give another --out, or move the file away; `xlapipe report` still reads an old file alone"
        )
    return found


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
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict) and "variant" in record and "repeat" in record:
            problem = damage(record)
            if problem is not None:
                raise ValueError(
                    f"{path}, line {number}: {problem}. The file was edited or damaged: correct that "
                    "line or remove it (each line is one run; a removed run is run again on --resume)"
                )
            records.append(record)
        else:
            bad += 1
    if bad:
        warnings.warn(f"{path}: skipped {bad} unreadable line(s) (a run killed mid-write?)", stacklevel=2)
    return records


# Times and rates a run measures: a recorded one that is not positive was never measured.
POSITIVE = ("epoch_s", "wall_s", "step_s", "steps_per_s", "first_update_s")


def damage(record: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of a record that the analysis reads (None when nothing is)."""
    repeat, report = record.get("repeat"), record.get("report")
    if not isinstance(record.get("variant"), str):
        return f"'variant' is {record.get('variant')!r}, not a variant's name"
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        return f"'repeat' is {repeat!r}, not a round number (1, 2, ...)"
    if report is not None and not isinstance(report, dict):
        return f"'report' is {report!r}, not the run's figures (an object)"
    for name in POSITIVE:
        value = (report or {}).get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            return f"report[{name!r}] is {value!r}: a time or a rate is a positive number"
    return None


def config_key(target: str, args: Sequence[str], kwargs: Mapping[str, Any] | None = None) -> str:
    """What must match (besides variant and repeat) for a recorded run to count as done."""
    return json.dumps({"target": target, "args": list(args), "kwargs": dict(kwargs or {})}, sort_keys=True)


def record_key(record: Mapping[str, Any]) -> tuple[str, str, int]:
    variant_key = json.dumps([record["variant"], record.get("pipeline_description", [])], sort_keys=True)
    return variant_key, record.get("config", ""), int(record["repeat"])


@frozen
class Results:
    """An ablation's variants, its baseline, every record that belongs to it, and how to judge them."""

    variants: tuple[Variant, ...] = field(converter=variant_tuple)
    baseline: str
    records: tuple[dict[str, Any], ...] = field(converter=records_tuple)
    judging: Judging = field(factory=Judging)
    mode: str = ""
    refused: tuple[Any, ...] = ()
    out: str | None = None
    factors: tuple[str, ...] = field(default=(), converter=strs)
    design: str = ""
    notes: tuple[str, ...] = field(default=(), converter=strs)

    def runs_of(self, variant: Variant) -> list[dict[str, Any]]:
        """The latest record of each repeat of ``variant`` (a retry replaces a failure)."""
        latest: dict[int, dict[str, Any]] = {}
        for r in self.records:
            if r["variant"] == variant.name and r.get("pipeline_description") == variant.description:
                prior = latest.get(int(r["repeat"]))
                if prior is None or prior.get("status") != "ok" or r.get("status") == "ok":
                    latest[int(r["repeat"])] = r
        return [latest[k] for k in sorted(latest)]

    def analysis(self) -> Analysis:
        """What the records say: figures, paired verdicts, effects (factorial), the recommendation."""
        return self._analysis

    @functools.cached_property
    def _analysis(self) -> Analysis:  # built once: the value is immutable
        return analyse(
            self.variants,
            self.baseline,
            {v.name: self.runs_of(v) for v in self.variants},
            self.judging,
            mode=self.mode,
            refused=self.refused,
            factors=self.factors,
            design=self.design,
            notes=self.notes,
            recommend=recommend,
        )

    def summaries(self) -> list[Summary]:
        """One :class:`~xlapipe.ablation.analysis.Summary` per variant, in plan order."""
        return list(self.analysis().summaries)

    @property
    def unresolved(self) -> tuple[str, ...]:
        """Variants whose interval neither excludes 1 nor is narrower than the resolution."""
        return self.analysis().unresolved

    @property
    def recommendation(self) -> Recommendation | None:
        return self.analysis().recommendation

    @property
    def ok(self) -> bool:
        """True when every run recorded for the plan succeeded."""
        return all(set(s.statuses) <= {"ok"} and s.statuses for s in self.summaries())

    def __getitem__(self, name: str) -> Summary:
        return self.analysis()[name]

    def with_notes(self, *notes: str) -> Results:
        return evolve(self, notes=(*self.notes, *notes))

    def table(self) -> str:
        """The console table (variant, time, change and verdict against the baseline)."""
        return report.table(self.analysis())

    def write(self, out: str | os.PathLike | None = None) -> dict[str, Path]:
        """Write the Markdown table, CSV, plots and recommendation into ``out`` (default: where the results are)."""
        where = out or self.out
        if where is None:
            raise ValueError("give an output folder: results.write('results/ablation')")
        return report.write_all(self.analysis(), where)

    @classmethod
    def load(cls, path: str | os.PathLike, **judging: Any) -> Results:
        """Rebuild results from a results file (variants in first-seen order, latest config).

        The runs are judged as they were recorded (figure, confidence, rounds ...),
        except for what ``judging`` changes (fields of :class:`Judging`). A figure
        given that is neither a known one nor one some run reports is refused.
        """
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        records = load(path)
        if not records:
            raise ValueError(f"{path} holds no results; run `xlapipe ablate ... --out {path.parent}` first")
        last = records[-1]
        mine = [r for r in records if r.get("config") == last.get("config")]
        old = check_edition(mine, path, resuming=False) < FORMAT
        variants: dict[str, Variant] = {}
        for r in sorted(mine, key=lambda r: r.get("variant_index", 0)):
            key = json.dumps([r["variant"], r.get("pipeline_description", [])], sort_keys=True)
            if key not in variants:
                pipeline = Pipeline.from_outline(r.get("pipeline_description", []))  # torch-free
                variants[key] = Variant(r["variant"], pipeline, r.get("note", ""))
        names = [v.name for v in variants.values()]
        baseline: str = last["baseline"] if last.get("baseline") in names else names[0]
        plan = last.get("plan") or {}
        refused = tuple(Refused(tuple(r[0]), r[1]) for r in plan.get("refused", []))
        kept = last.get("judging") or {"until_resolved": False}  # before rounds were recorded: one look
        recorded = {k: v for k, v in kept.items() if k in JUDGING_KEYS}
        chosen = Judging(**{**recorded, **judging})
        if "figure" in judging:
            check_figure(chosen.figure, {*FIGURES, *reported_figures(mine, chosen)})
        return cls(
            variants.values(),
            baseline,
            mine,
            chosen,
            last.get("mode", ""),
            refused,
            str(path.parent),
            factors=tuple(plan.get("factors", ())),
            design=plan.get("design", ""),
            notes=(f"{path}: {PREVIOUS_EDITION}.",) if old else (),
        )


JUDGING_KEYS = ("figure", "confidence", "resolution", "tolerance", "repeats", "until_resolved", "max_rounds")
# A record's "format" (2), "position" and "order_seed" (the round's random order) and "machine"
# ({"host": ..., "node": ...}: the block of a paired comparison is the round and the machine).


def recorded_judging(judging: Judging) -> dict[str, Any]:
    """What a record keeps of how its ablation was judged (for :meth:`Results.load`)."""
    return {k: getattr(judging, k) for k in JUDGING_KEYS}


def reported_figures(records: Sequence[Mapping[str, Any]], judging: Judging) -> set[str]:
    """Every figure some successful run among ``records`` reports (derived ones included)."""
    return {
        k
        for r in records
        if r.get("status") == "ok"
        for k in run_figures(r.get("report"), judging.target_metric)
    }
