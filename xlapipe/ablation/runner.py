"""Run every variant of an ablation in its own fresh process, round by round, until it is decided.

Each round runs every variant once, in a fresh random order drawn from a
seed that names the target and the round (recorded with each run, the same
on a resume), so a slow spell, cache warmth or a neighbour cannot favour a
fixed position; the round is the block the paired comparisons match. After
``judging.repeats`` rounds (on several machines, as many more as fill their
first waves: :func:`fixed_rounds`), the rows still unresolved and the rows they are
compared with get more rounds (a resolved one is not run again) until every
row is resolved, the rounds reach ``judging.max_rounds``, two rounds in a row
add no pair, or the budget is spent: no run starts that would not fit in what
is left of it (its estimate: the variant's longest run so far). Each finished
run is appended to ``OUT/results.jsonl`` at once; the same command again
resumes.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import evolve, field, frozen

from xlapipe.ablation import results as store
from xlapipe.ablation.analysis import FIGURES, Analysis, check_figure
from xlapipe.ablation.engines import Engine, Job, Local, Spec
from xlapipe.ablation.lock import OutLock
from xlapipe.ablation.options import Judging, Output, Runs, Variants
from xlapipe.ablation.outlines import outlines
from xlapipe.ablation.progress import Clock, Progress, duration, status
from xlapipe.ablation.report import headline
from xlapipe.ablation.results import Results
from xlapipe.ablation.target import (
    Target,
    as_description,
    child_env,
    parse_printed_pipeline,
    resolve_target,
)
from xlapipe.ablation.variants import Plan, Variant, check_description, plan
from xlapipe.child_process import interruptible
from xlapipe.child_process import run as run_child
from xlapipe.pipeline import Pipeline

FIRST_RUN_LIMIT = 3600.0  # seconds a variant's first run may take when no timeout is given
LIMIT_FACTOR, LEAST_LIMIT = 4.0, 120.0  # later runs: four times the variant's longest run, at least 2 min
DISCOVERED = "pipeline.json"
TOO_SHORT = "too short to measure"


def _slug(index: int, name: str) -> str:
    return f"{index:02d}-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:60] or "variant")


def run_paths(runs_dir: Path, index: int, variant: Variant, repeat: int) -> tuple[Path, Path]:
    """(log, report) of a run: never the files of an earlier run (a retry gets ``.a2``, ``.a3`` ...)."""
    stem = f"{_slug(index, variant.name)}.r{repeat}"
    attempt = 1
    while True:
        name = stem if attempt == 1 else f"{stem}.a{attempt}"
        log, report = runs_dir / f"{name}.log", runs_dir / f"{name}.json"
        if not log.exists() and not report.exists():
            return log, report.resolve()
        attempt += 1


def config_dir(config: str) -> str:
    """A short, stable folder name for one target and its arguments (their runs' logs go there)."""
    return "c" + hashlib.sha256(config.encode()).hexdigest()[:10]


def order_seed(config: str, round_: int) -> str:
    """The seed of a round's random order: the same target and round, the same order (a resume too)."""
    return hashlib.sha256(f"{config}\nround {round_}".encode()).hexdigest()[:16]


def shuffled(todo: Sequence[tuple[int, int, Variant]], config: str) -> list[tuple[int, int, Variant]]:
    """``todo`` (runs of one round) in the round's random order (see :func:`order_seed`)."""
    if not todo:
        return []
    out = list(todo)
    random.Random(order_seed(config, todo[0][0])).shuffle(out)
    return out


def schedule(the_plan: Plan, repeats: int, config: str | None = None) -> Iterator[tuple[int, int, Variant]]:
    """(round, index, variant): every variant once per round, in the round's random order.

    Without ``config`` the rounds keep the plan's order (round-robin).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for r in range(1, repeats + 1):
        todo = [(r, i, v) for i, v in enumerate(the_plan.variants)]
        yield from todo if config is None else shuffled(todo, config)


@frozen
class Budget:
    """Wall time left to an ablation (None: no limit), on ``clock`` (seconds; tests give their own)."""

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    start: float = field()

    @start.default
    def _now(self) -> float:
        return self.clock()

    @property
    def spent(self) -> float:
        return self.clock() - self.start

    @property
    def left(self) -> float | None:
        return None if self.seconds is None else max(0.0, self.seconds - self.spent)

    def fits(self, estimate: float | None) -> bool:
        return self.seconds is None or self.spent + (estimate or 0.0) <= self.seconds


def make_plan(variants: Variants, full: Pipeline | None) -> Plan:
    """The variants to run, from what was asked and the full pipeline."""
    the_plan = plan(
        variants.mode,
        full,
        baseline=variants.baseline,
        factors=variants.factors,
        order=variants.order,
        cumulative=variants.cumulative,
        variants=variants.explicit,
        design=variants.design,
    )
    the_plan = the_plan.with_eager() if variants.eager_reference else the_plan
    the_plan = the_plan.with_twin() if variants.aa else the_plan
    return the_plan.with_baseline(variants.reference)


def ablate(
    target: str | Callable,
    args: Sequence[str] | Mapping[str, Any] = (),
    *,
    variants: Variants | None = None,
    judging: Judging | None = None,
    runs: Runs | None = None,
    output: Output | str | os.PathLike | None = None,
) -> Results:
    """Measure ``target`` under each variant of its pipeline and decide each; see docs/ablation.md.

    ``target`` is a training script (``args``: its command-line arguments),
    run unchanged: the session measures it and each variant replaces the
    pipeline it trains with (``Runs(contract=True)`` for a script that follows
    the workload contract); or ``module:function`` called as
    ``fn(pipeline, **args)``. ``variants`` says which pipelines, ``judging``
    the figure and how it is decided, ``runs`` how each run runs, ``output``
    where the results go (a folder, or an :class:`Output`). Runs already
    recorded there for the same target and arguments are not run again.
    """
    variants, judging, runs = variants or Variants(), judging or Judging(), runs or Runs()
    if runs.ray is not None:
        from xlapipe.ablation.fleet import import_ray

        import_ray()  # not installed: refused at once, with the install command
    budget = Budget(judging.budget)  # wall time from the start of the command
    output = output if isinstance(output, Output) else Output() if output is None else Output(output)
    # the runs import the --import modules too: a variant may name a practice the script never imports
    tgt = evolve(resolve_target(target, args, runs.contract), imports=variants.imports)
    out = output.folder
    recorded = [r for r in store.load(out / store.RESULTS_FILE) if r.get("config") == tgt.config]
    store.check_edition(recorded, out / store.RESULTS_FILE, resuming=True)
    check_figure(judging.figure, {*FIGURES, *store.reported_figures(recorded, judging)})
    variants = _outlined(variants, runs.python)
    early = None  # planned before any run starts when nothing needs the script: bad input refused first
    if variants.pipeline is not None or variants.mode == "explicit":
        early = make_plan(variants, variants.pipeline)
    elif tgt.kind == "function":
        raise ValueError(
            f"a function target ({tgt.spec}) cannot tell its pipeline: give the full pipeline "
            "(Variants(pipeline=...), CLI: --pipeline JSON)"
        )
    with OutLock(out), interruptible():
        runs_dir = out / "runs" / config_dir(tgt.config)
        runs_dir.mkdir(parents=True, exist_ok=True)
        env = child_env(runs.env)
        with _engine(runs, tgt, env) as engine:
            the_plan = (  # else the script runs up to its pipeline, which the plan needs
                early
                if early is not None
                else make_plan(variants, _discover(tgt, runs, runs_dir, env, variants.imports))
            )
            runner = _Runner(the_plan, tgt, runs_dir, engine, runs, judging, output, budget)
            notes = runner.run()
        res = runner.results().with_notes(*notes)
        res.write(out)
    return res


def _outlined(variants: Variants, python: str) -> Variants:
    """``variants`` with the pipelines it gives as outlines: descriptions rebuilt, so checked, at once.

    The rebuilding imports torch and the practices; in the CLI's driver it
    happens in one child process (:mod:`xlapipe.ablation.outlines`), so the
    driver stays small. The ``imports`` are imported there (a bad one refused
    now, as every pipeline given).
    """
    given: list[Any] = [] if variants.pipeline is None else [as_description(variants.pipeline)]
    items: list[Any] = list(variants.explicit or ()) if variants.mode == "explicit" else []
    where: list[int] = []  # the explicit items whose pipeline is rebuilt, in order
    for i, item in enumerate(items):
        value = (
            item.pipeline
            if isinstance(item, Variant)
            else item.get("pipeline")
            if isinstance(item, Mapping)
            else item
        )
        if isinstance(value, (Pipeline, list)):
            given.append(
                value if isinstance(value, Pipeline) else check_description(value, f"explicit variant {i}")
            )
            where.append(i)
    if not given and not variants.imports:
        return variants
    built = outlines(given, variants.imports, python)
    full = built.pop(0) if variants.pipeline is not None else None
    for i, pipeline in zip(where, built):
        item = items[i]
        items[i] = (
            evolve(item, pipeline=pipeline)
            if isinstance(item, Variant)
            else {**item, "pipeline": pipeline}
            if isinstance(item, Mapping)
            else pipeline
        )
    return evolve(variants, pipeline=full, explicit=items if variants.explicit is not None else None)


@contextlib.contextmanager
def _engine(runs: Runs, tgt: Target, env: Mapping[str, str]) -> Iterator[Engine]:
    """This machine, or the machines of the Ray cluster ``runs.ray`` names (checked first)."""
    if runs.ray is None:
        yield Local(env)
        return
    from xlapipe.ablation.fleet import RayFleet

    fleet = RayFleet(runs.ray, runs.ray_resources, tgt, runs.env)
    try:
        fleet.connect()
        yield fleet
    finally:
        fleet.close()


def _discover(
    tgt: Target, runs: Runs, runs_dir: Path, env: Mapping[str, str], imports: Sequence[str]
) -> Pipeline:
    """The pipeline the script trains with: run it (on this machine) up to its pipeline, where it stops."""
    limit = runs.timeout or FIRST_RUN_LIMIT
    report = runs_dir / DISCOVERED
    argv, added = tgt.discovery(runs.python, report)
    done = run_child(argv, log=runs_dir / "pipeline.log", env={**env, **added}, limit=limit)
    trace = done.tail()
    if done.status == "timeout":
        raise RuntimeError(
            f"running {' '.join(argv[1:2])} up to its pipeline did not finish in {limit:g} s (the run's "
            "time limit); give a longer --timeout, or check that the script reaches xp.session"
        )
    if tgt.kind == "contract":
        if done.status != "ended":
            raise RuntimeError(f"{' '.join(argv)} failed:\n{trace}")
        printed = parse_printed_pipeline(argv, done.log.read_text(errors="replace"))
        return outlines([printed], imports, runs.python)[0]
    try:
        found = json.loads(report.read_text())
        if "error" in found:
            raise RuntimeError(f"the pipeline {' '.join(argv[1:])} trains with: {found['error']}")
        outline = found["outline"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(
            f"{' '.join(argv[1:])} never opened an xp.session (the ablation finds a script's pipeline "
            "there, and measures it there); a script that follows the workload contract takes "
            f"--contract. Its output:\n{trace}"
        ) from None
    return Pipeline.from_outline(outline)


def fixed_rounds(judging: Judging, machines: int) -> int:
    """The rounds every variant runs: ``repeats``, made whole waves when several machines run rounds.

    With rounds to be added until resolved, the machines a wave would leave idle (3 rounds asked on 8
    machines) take rounds at once, up to ``max_rounds``: the same wall time, decided sooner. The
    intervals keep their level: it is set for a look after every round from ``repeats`` on, and
    fewer looks are taken.
    """
    if not judging.until_resolved or machines <= 1:
        return judging.repeats
    return min(judging.rounds, -(-judging.repeats // machines) * machines)


class _Runner:
    """Runs the plan in waves of rounds through an engine, appends each outcome, decides what to run next."""

    def __init__(
        self,
        the_plan: Plan,
        tgt: Target,
        runs_dir: Path,
        engine: Engine,
        runs: Runs,
        judging: Judging,
        output: Output,
        budget: Budget,
    ) -> None:
        self.plan, self.tgt, self.runs_dir, self.engine = the_plan, tgt, runs_dir, engine
        self.runs, self.judging, self.output, self.budget = runs, judging, output, budget
        self.path = output.folder / store.RESULTS_FILE
        mine = self._records()
        self.done = self._settled(mine)
        elapsed: dict[str, list[float]] = {}
        for r in mine:
            if r.get("status") != "lost":
                elapsed.setdefault(r["variant"], []).append(float(r.get("elapsed_s") or 0.0))
        self.clock = Clock(elapsed)
        self.undecided: tuple[str, ...] = ()
        self.progress: Progress | None = None
        self.planned: list[Job] = []  # the wave's runs not started yet (for the time left)
        self.later = 0  # fixed rounds after this wave
        self.flying: dict[tuple[int, int, int], tuple[Job, str]] = {}  # runs in flight, where each runs
        self.fixed = fixed_rounds(judging, engine.slots)

    def _records(self) -> list[dict[str, Any]]:
        return [r for r in store.load(self.path) if r.get("config") == self.tgt.config]

    def _rounds_run(self) -> int:
        """The highest round recorded for this target (0 before any)."""
        return max((int(r["repeat"]) for r in self._records()), default=0)

    def _settled(self, records: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, int]]:
        settled = {"ok"} if self.runs.retry_failed else {"ok", "error", "timeout"}
        return {store.record_key(r) for r in records if r.get("status") in settled}

    def results(self) -> Results:
        p = self.plan
        return Results(
            p.variants,
            p.baseline,
            self._records(),
            self.judging,
            mode=p.mode,
            refused=p.refused,
            out=str(self.output.folder),
            factors=p.factors,
            design=p.design,
        )

    def _todo(self, round_: int, names: Sequence[str] | None = None) -> list[Job]:
        """The runs of round ``round_`` not recorded yet, in the round's random order."""
        todo = [
            (round_, i, v)
            for i, v in enumerate(self.plan.variants)
            if (names is None or v.name in names) and (v.key, self.tgt.config, round_) not in self.done
        ]
        return [Job(r, i, v, at) for at, (r, i, v) in enumerate(shuffled(todo, self.tgt.config))]

    def run(self) -> list[str]:
        """The fixed rounds, then (until resolved) more; notes for the report."""
        judging, variants, fixed = self.judging, self.plan.variants, self.fixed
        planned = fixed * len(variants)
        keys = {v.key for v in variants}
        recorded = sum(1 for key, _, r in self.done if key in keys and r <= fixed)
        self._header(planned, planned - recorded)
        self.progress = Progress(planned, recorded, self.output.progress, self.output.echo)
        try:
            slots = self.engine.slots
            for first in range(1, fixed + 1, slots):
                last = min(first + slots, fixed + 1)
                self.later = fixed + 1 - last
                stopped = self._wave([self._todo(r) for r in range(first, last)])
                if stopped:
                    return [f"{stopped}: the runs planned from there on were not started."]
                analysis = self.results().analysis()
                self.undecided = analysis.unresolved
                missing = _no_figure(analysis)
                if missing:
                    return [missing]
            self.later = 0
            return self._until_resolved() if judging.until_resolved else []
        finally:
            self.progress.close()

    def _header(self, planned: int, left: int) -> None:
        echo = self.output.echo
        if not echo:
            return
        p, judging = self.plan, self.judging
        more = (
            f", then rounds of the undecided ones up to {judging.rounds}"
            if judging.until_resolved and judging.rounds > self.fixed
            else ""
        )
        filled = (
            f" ({judging.repeats} asked, {self.fixed} to fill the first waves of {self.engine.slots} machines)"
            if self.fixed != judging.repeats
            else ""
        )
        echo(
            f"ablation ({p.mode}) of {self.tgt.spec}: {len(p.variants)} variants x {self.fixed} "
            f"round(s){filled}{more}; {planned - left} already recorded in {self.path}, {left} to run "
            f"({self.engine.how})"
        )
        for r in p.refused[:10]:
            echo(f"  refused: {' + '.join(r.names) or '(none)'}: {r.reason}")
        if len(p.refused) > 10:
            echo(f"  ... and {len(p.refused) - 10} more refused combinations (listed in ablation.md)")
        if p.design and p.mode == "factorial":
            echo(f"  design: {p.design}")

    def _until_resolved(self) -> list[str]:
        judging = self.judging
        idle = 0
        analysis = self.results().analysis()
        r = self.fixed + 1
        while r <= judging.rounds:
            unresolved = analysis.unresolved
            if not unresolved:
                break
            names = ", ".join(unresolved)
            rounds = list(range(r, min(r + self.engine.slots, judging.rounds + 1)))
            wave = [self._todo(k, analysis.needed()) for k in rounds]
            estimate = self.clock.total((j.variant.name for j in wave[0]), longest=True)
            if not self.budget.fits(estimate):
                return [
                    f"Unresolved when the budget ({self.budget.seconds:g} s) ran out after "
                    f"{self.budget.spent:.0f} s (round {r} would take about {estimate or 0:.0f} s): {names}."
                    + self._to_decide(analysis)
                ]
            assert self.progress is not None
            self.progress.extend(sum(len(jobs) for jobs in wave))
            if self.output.echo and wave[0]:
                also = sorted({j.variant.name for j in wave[0]} - set(unresolved))
                which = f"round {r}" if len(rounds) == 1 else f"rounds {r}-{rounds[-1]}"
                self.output.echo(
                    f"{which} (until resolved): {names}" + (f", with {', '.join(also)}" if also else "")
                )
            paired = _pairs(analysis, unresolved)
            stopped = self._wave(wave)
            if stopped:
                return [f"{stopped}; unresolved: {names}."]
            analysis = self.results().analysis()
            self.undecided = analysis.unresolved
            idle = idle + 1 if _pairs(analysis, unresolved) == paired else 0
            if idle >= 2:
                return [
                    f"Unresolved after round {rounds[-1]}: the last two rounds added no paired run (the "
                    f"rows compared failed; see the failed runs below), so more rounds would not decide: "
                    f"{', '.join(analysis.unresolved)}."
                ]
            r = rounds[-1] + 1
        if analysis.unresolved:
            return [
                f"Unresolved after {judging.rounds} rounds (the most asked, max_rounds): "
                f"{', '.join(analysis.unresolved)}." + self._to_decide(analysis)
            ]
        rounds_run = self._rounds_run()
        return [
            f"Resolved: every variant's interval excludes 1.0 or is within ±{judging.resolution:.0%} "
            f"(after {rounds_run} round{'s' * (rounds_run != 1)})."
        ]

    def _to_decide(self, analysis: Analysis) -> str:
        """What deciding the unresolved rows would take at this machine's pace, if the spread stays."""
        res = self.judging.resolution
        need = [
            s.deciding.rounds_to_decide(res)
            for s in analysis.summaries
            if s.variant.name in analysis.unresolved and s.deciding is not None
        ]
        rounds = max((n for n in need if n is not None), default=None)
        if rounds is None:
            return ""
        if rounds > 10_000:
            return f" Deciding them within ±{res:.0%} would take more than 10,000 paired rounds."
        done = self._rounds_run()
        per_round = self.clock.total(analysis.needed())
        pace = (
            ""
            if per_round is None or rounds <= done
            else f", about {duration((rounds - done) * per_round / self.engine.slots)} more at this run's pace"
        )
        them = "them" if len(analysis.unresolved) > 1 else "it"
        return (
            f" Deciding {them} within ±{res:.0%} would take about {rounds} paired rounds in all{pace} "
            "(if the spread between runs stays what it was)."
        )

    def _left(self) -> tuple[float | None, float | None]:
        """Seconds left: the runs planned from now on, and at most (every round the undecided may get)."""
        judging, names = self.judging, [v.name for v in self.plan.variants]
        slots = self.engine.slots
        this_wave = self.clock.total(j.variant.name for j in self.planned)
        per_round = self.clock.total(names)
        left = (
            None if this_wave is None or per_round is None else (this_wave + self.later * per_round) / slots
        )
        done_rounds = max((j.round for j in self.planned), default=self.fixed)
        added = judging.rounds - max(done_rounds, self.fixed) if judging.until_resolved else 0
        undecided = self.undecided or tuple(n for n in names if n != self.plan.baseline)
        per_added = self.clock.total([self.plan.baseline, *undecided]) if added > 0 else 0.0
        most = None if left is None or per_added is None else left + added * per_added / slots
        return left, most

    def _wave(self, rounds: Sequence[Sequence[Job]]) -> str:
        """Run ``rounds`` through the engine; why the budget stopped it early, or "" when it did not."""
        self.planned = [j for jobs in rounds for j in jobs]
        return self.engine.run_wave(rounds, self)

    # -- the engine's calls (engines.Calls) ----------------------------------------------------
    def admit(self, job: Job) -> str:
        longest = self.clock.longest(job.variant.name)
        if self.budget.fits(longest):
            return ""
        return (
            f"Budget of {self.budget.seconds:g} s: after {self.budget.spent:.0f} s, {job.variant.name} "
            f"(round {job.round}, up to {longest or 0:.0f} s) would not fit in what was left"
        )

    def prepare(self, job: Job) -> Spec:
        log, report = run_paths(self.runs_dir, job.index, job.variant, job.round)
        description = job.variant.description
        return Spec(
            cmd=self.tgt.command(self.runs.python, description, report),
            env=self.tgt.env(description, report, self.runs.warmup),
            limit=run_limit(self.runs.timeout, self.clock.elapsed.get(job.variant.name, [])),
            log=log,
            report=report,
        )

    def starting(self, job: Job, machine: str) -> None:
        assert self.progress is not None
        self.planned = [j for j in self.planned if (j.round, j.index) != (job.round, job.index)]
        left, most = self._left()
        state = status(left, most, self.undecided, self.budget.left)
        self.flying[(job.round, job.index, job.attempt)] = (job, machine)
        self.progress.starting(self._in_flight(), state)

    def _in_flight(self) -> str:
        """``round 2: +a`` on one machine; ``m1: +a (round 2), m2: +b (round 3)`` on several."""
        flying = list(self.flying.values())
        if len(flying) == 1 and not flying[0][1]:
            return f"round {flying[0][0].round}: {flying[0][0].variant.name}"
        return ", ".join(f"{m}: {j.variant.name} (round {j.round})" for j, m in flying)

    def finish(self, job: Job, spec: Spec, outcome: dict[str, Any], machine: Mapping[str, Any]) -> None:
        assert self.progress is not None
        self.flying.pop((job.round, job.index, job.attempt), None)
        outcome = self.judged(outcome, spec.log)
        self.record(job, spec, outcome, machine)
        if outcome["status"] == "lost":
            self.progress.finished(_line(job.variant, job.round, outcome, self.judging.figure))
            self.progress.extend(1 if job.attempt == 1 else 0)
            return
        self.clock.add(job.variant.name, float(outcome["elapsed_s"]))
        if outcome["status"] == "ok" or not self.runs.retry_failed:
            self.done.add((job.variant.key, self.tgt.config, job.round))
        self.progress.finished(_line(job.variant, job.round, outcome, self.judging.figure))

    def judged(self, outcome: dict[str, Any], log: Path) -> dict[str, Any]:
        """The outcome with the printed metric read from the log, and a run too short to measure failed."""
        if outcome["status"] == "ok" and self.runs.metric:
            found = printed_metric(log.read_text(errors="replace"), self.runs.metric)
            if found is not None:
                outcome["report"].update(metric=found, metric_name=self.runs.metric)
        short = outcome["status"] == "ok" and (outcome.get("report") or {}).get("too_short")
        if short:
            outcome.update(status="error", error=f"{TOO_SHORT}: {short}")
        return outcome

    def record(self, job: Job, spec: Spec, outcome: Mapping[str, Any], machine: Mapping[str, Any]) -> None:
        """Append the run's record to the results file (flushed: a killed ablation resumes after it)."""
        p, variant = self.plan, job.variant
        store.append(
            self.path,
            {
                "variant": variant.name,
                "variant_index": job.index,
                "note": variant.note,
                "pipeline": repr(variant.pipeline),
                "pipeline_description": variant.description,
                "format": store.FORMAT,
                "repeat": job.round,
                "position": job.position,  # in the round's random order (from 0)
                "order_seed": order_seed(self.tgt.config, job.round),
                "machine": dict(machine),
                "attempt": job.attempt,
                "pjrt_device": child_env(self.runs.env).get("PJRT_DEVICE", ""),
                "command": spec.cmd,
                "config": self.tgt.config,
                "target": self.tgt.spec,
                "kind": self.tgt.kind,
                "args": list(self.tgt.args),
                "kwargs": self.tgt.kwargs,
                "mode": p.mode,
                "baseline": p.baseline,
                "log": str(spec.log),
                "plan": {
                    "factors": list(p.factors),
                    "design": p.design,
                    "refused": [[list(r.names), r.reason] for r in p.refused],
                },
                "judging": store.recorded_judging(self.judging),
                "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                **outcome,
            },
        )


def run_limit(timeout: float | None, elapsed: Sequence[float]) -> float:
    """A run's time limit: ``timeout`` if asked, else sized from the variant's runs so far (``elapsed``)."""
    if timeout is not None:
        return timeout
    return FIRST_RUN_LIMIT if not elapsed else max(LEAST_LIMIT, LIMIT_FACTOR * max(elapsed))


def _no_figure(analysis: Analysis) -> str:
    """Why no round can decide anything when no successful run reports the figure compared, else ""."""
    ok = [s for s in analysis.summaries if s.ok_runs]
    short = [e for s in analysis.summaries for _, _, e in s.errors if e.startswith(TOO_SHORT)]
    if not ok and short:
        return f"Every run was {short[-1]}. The rounds were stopped; the same command with more steps starts over."
    failed = [e for s in analysis.summaries for _, _, e in s.errors]
    if not ok and failed:
        return (
            f"No run succeeded, so nothing can be compared: the rounds were stopped. The last error: "
            f"{headline(failed[-1])[:300]}. Fix it and run the same command again (failed runs run again)."
        )
    if not ok or any(analysis.figure in s.figures for s in ok):
        return ""
    reported = sorted({k for s in ok for k in s.figures} & {"step_s", "wall_s", "steps_per_s"})
    hint = f" (the runs report {', '.join(reported)})" if reported else ""
    return (
        f"No run reports {analysis.figure}, so no round can decide anything: the rounds were stopped. "
        f"Compare another figure{hint} with --figure; the runs made are kept and the same command "
        "with it resumes them. (A script run unchanged reports epoch_s when a run.batches loop runs out.)"
    )


def _pairs(analysis: Analysis, names: Sequence[str]) -> int:
    """Paired rounds behind the deciding intervals of the variants ``names`` (increment or baseline)."""
    return sum(s.deciding.n for s in analysis.summaries if s.variant.name in names and s.deciding is not None)


def printed_metric(output: str, name: str) -> float | None:
    """The last number the run printed after ``name`` (``accuracy 0.84``, ``accuracy: 0.84``, ``accuracy=0.84``)."""
    number = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
    found = re.findall(rf"(?<![\w.]){re.escape(name)}\s*[:=]?\s*({number})", output)
    return float(found[-1]) if found else None


def _line(variant: Variant, round_: int, outcome: Mapping[str, Any], figure: str) -> str:
    if outcome["status"] != "ok":
        return f"  {variant.name} (round {round_}): {outcome['status']}: {headline(outcome['error'])[:200]}"
    value = outcome["report"].get(figure)
    shown = f"{value:.3g}" if isinstance(value, (int, float)) else "n/a"
    return f"  {variant.name} (round {round_}): ok, {figure} {shown}, run {outcome['elapsed_s']:.0f} s"
