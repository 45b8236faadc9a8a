"""Run every variant of an ablation in its own fresh process, with a timeout, resumably.

Repeats are interleaved (repeat 1 of every variant, then repeat 2, ...), so a
slow spell on a shared machine spreads over all variants instead of hitting
one. Each finished run is appended to ``OUT/results.jsonl`` at once. With
``until_resolved`` more interleaved rounds are run, of the reference and the
variants still unresolved, until each is resolved or the budget is spent.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xlapipe.ablation import results as store
from xlapipe.ablation.analysis import TargetMetric, check_judging
from xlapipe.ablation.processes import ISOLATIONS, OutLock, ProcessServer, run_one, terminate_as_interrupt
from xlapipe.ablation.report import headline
from xlapipe.ablation.results import Results
from xlapipe.ablation.target import (  # noqa: F401  (Target, resolve_target: re-exported)
    Target,
    as_pipeline,
    child_env,
    import_modules,
    parse_printed_pipeline,
    print_pipeline,
    refuse_function_print,
    resolve_target,
)
from xlapipe.ablation.variants import Plan, Variant
from xlapipe.ablation.variants import plan as make_plan
from xlapipe.pipeline import Pipeline


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


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``1h``, ``1h30m``; refuses non-finite and non-positive ones."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text)
        if not text or parts is None or not any(parts.groups()):
            raise ValueError(f"a duration is seconds or e.g. 90s, 30m, 1h, 1h30m; got {value!r}")
        h, m, sec = (float(g) if g else 0.0 for g in parts.groups())
        seconds = 3600 * h + 60 * m + sec
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"a duration must be a positive, finite number of seconds, got {value!r}")
    return seconds


def _positive_seconds(value: float, what: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {value!r}")
    return seconds


def schedule(plan: Plan, repeats: int) -> list[tuple[int, int, Variant]]:
    """(repeat, index, variant) in round-robin order: every variant once, then again."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    return [(r, i, v) for r in range(1, repeats + 1) for i, v in enumerate(plan.variants)]


@frozen
class Budget:
    """Wall time left to an ablation (None: no limit)."""

    seconds: float | None
    start: float = field(factory=time.monotonic)

    @property
    def spent(self) -> float:
        return time.monotonic() - self.start

    @property
    def over(self) -> bool:
        return self.seconds is not None and self.spent >= self.seconds

    def fits(self, estimate: float) -> bool:
        return self.seconds is None or self.spent + estimate <= self.seconds


def ablate(
    target: str | Callable,
    pipeline: Pipeline | str | Sequence[Any] | None = None,
    mode: str = "leave-one-out",
    *,
    args: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
    out: str | os.PathLike = "results/ablation",
    repeats: int = 1,
    timeout: float = 1800.0,
    baseline: Sequence[str] | None = None,
    reference: str | None = None,
    factors: Sequence[str] | None = None,
    order: Sequence[str] | None = None,
    cumulative: bool = True,
    variants: Sequence[Any] | None = None,
    design: str | None = None,
    eager_reference: bool = False,
    figure: str = "epoch_s",
    confidence: float = 0.95,
    resolution: float = 0.05,
    until_resolved: bool = False,
    budget: str | float | None = None,
    target_metric: str | float | TargetMetric | None = None,
    tolerance: float = 0.02,
    isolation: str = "fork",
    retry_failed: bool = True,
    progress: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    imports: Sequence[str] = (),
    echo: Callable[[str], None] | None = print,
) -> Results:
    """Measure ``target`` under each variant of ``pipeline``; see docs/ablation.md.

    ``target`` is a workload script (with ``args`` for it) or ``module:function``
    (called as ``fn(pipeline, **kwargs)``). ``pipeline`` defaults to what the
    script prints for ``--print-pipeline``. Runs already recorded ok in
    ``out/results.jsonl`` for the same target and arguments are skipped; failed
    ones are run again unless ``retry_failed=False``. ``imports`` are modules to
    import first, for transforms of your own (registered with ``@register``).

    Judging: each variant's speed-up over the reference gets an interval at
    ``confidence``, paired by repeat; ``until_resolved`` adds interleaved rounds
    until every interval excludes 1 or reaches no further than ``resolution``
    from it, or ``budget`` (seconds or "30m") is spent. ``target_metric``
    (e.g. ``0.8`` or ``"<=0.3"``) gives the time to reach it from the runs'
    ``metric_history``. The recommended pipeline keeps the reference's final
    loss and metric within ``tolerance``. ``isolation`` is ``"fork"`` (each run
    forked from a warm process that never started the XLA runtime) or
    ``"exec"`` (a fresh interpreter per run).
    """
    import_modules(imports)
    timeout = _positive_seconds(timeout, "timeout")
    limit = None if budget is None else parse_duration(budget)
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number of at least 1, got {repeats!r}")
    goal = None if target_metric is None else TargetMetric.parse(target_metric)
    check_judging(confidence, resolution, tolerance)
    python = python or sys.executable
    tgt = resolve_target(target, args, kwargs)
    environ = child_env(env)
    out = Path(out)
    clock = Budget(limit)

    def make(full: Pipeline | None) -> Plan:
        the_plan = make_plan(
            mode,
            full,
            baseline=baseline,
            factors=factors,
            order=order,
            cumulative=cumulative,
            variants=variants,
            design=design,
        )
        return (the_plan.with_eager() if eager_reference else the_plan).with_baseline(reference)

    # Plan first when nothing needs the script: bad input is refused before any process starts.
    early = None
    if pipeline is not None or mode == "explicit":
        early = make(None if pipeline is None else as_pipeline(pipeline))
    else:
        refuse_function_print(tgt)  # a script prints it; a function target cannot
    judge = dict(
        figure=figure, confidence=confidence, resolution=resolution, target=goal, tolerance=tolerance
    )
    with OutLock(out), terminate_as_interrupt():
        runs_dir = out / "runs" / config_dir(tgt.config)
        runs_dir.mkdir(parents=True, exist_ok=True)
        with ProcessServer(python, environ, runs_dir / "server.log") as server:
            printed = _warm(server, tgt, python, isolation, echo)
            if early is not None:
                the_plan = early
            else:
                the_plan = make(printed if printed is not None else print_pipeline(tgt, python, environ))
            runner = _Runner(
                the_plan,
                tgt,
                out,
                runs_dir,
                timeout,
                python,
                server,
                retry_failed,
                progress,
                echo,
                clock,
                judge,
            )
            notes = runner.run(repeats, until_resolved)
        res = runner.results().with_notes(*notes)
        res.write(out)
    return res


def _warm(
    server: ProcessServer, tgt: Target, python: str, isolation: str, echo: Callable[[str], None] | None
) -> Pipeline | None:
    """Warm the server up (fork isolation); the pipeline the script printed, if it did."""
    if isolation != "fork":
        return None
    if tgt.kind == "script":
        cmd = [python, tgt.spec, *tgt.args, "--print-pipeline"]
        reply = server.warm(cmd[:-1])  # the server runs it with --print-pipeline appended
        if reply["code"] != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed (exit {reply['code']}):\n"
                f"{(reply['error'] or reply['stdout'])[-3000:]}"
            )
        printed = parse_printed_pipeline(cmd, reply["stdout"])
    else:
        reply = server.warm([python, "-m", "xlapipe.ablation.worker"], function=tgt.spec)
        if reply["code"] != 0:
            raise RuntimeError(f"cannot import the function target {tgt.spec}:\n{reply['error'][-3000:]}")
        printed = None
    if reply["started"] and echo:
        echo(
            "  note: the workload started torch_xla's runtime while importing; runs cannot be forked "
            "from it, so each run is a fresh interpreter (isolation 'exec')"
        )
    return printed


class _Runner:
    """Runs the plan's jobs through the server, appends each outcome, and decides what to run next."""

    def __init__(
        self,
        plan: Plan,
        tgt: Target,
        out: Path,
        runs_dir: Path,
        timeout: float,
        python: str,
        server: ProcessServer,
        retry_failed: bool,
        progress: bool,
        echo: Callable[[str], None] | None,
        clock: Budget,
        judge: dict[str, Any],
    ) -> None:
        self.plan, self.tgt, self.out, self.runs_dir = plan, tgt, out, runs_dir
        self.timeout, self.python, self.server = timeout, python, server
        self.retry_failed, self.progress, self.echo, self.clock, self.judge = (
            retry_failed,
            progress,
            echo,
            clock,
            judge,
        )
        self.path = out / store.RESULTS_FILE

    def results(self) -> Results:
        records = [r for r in store.load(self.path) if r.get("config") == self.tgt.config]
        p = self.plan
        return Results(
            p.variants,
            p.baseline,
            records,
            mode=p.mode,
            refused=p.refused,
            out=str(self.out),
            factors=p.factors,
            design=p.design,
            **self.judge,
        )

    def _done(self) -> set[tuple[str, str, int]]:
        settled = {"ok"} if self.retry_failed else {"ok", "error", "timeout"}
        return {store.record_key(r) for r in store.load(self.path) if r.get("status") in settled}

    def run(self, repeats: int, until_resolved: bool) -> list[str]:
        """Run the fixed repeats, then (``until_resolved``) more rounds; notes for the report."""
        jobs = schedule(self.plan, repeats)
        done = self._done()
        todo = [j for j in jobs if (j[2].key, self.tgt.config, j[0]) not in done]
        if self.echo:
            self.echo(
                f"ablation ({self.plan.mode}) of {self.tgt.spec}: {len(self.plan.variants)} variants x "
                f"{repeats} repeat(s); {len(jobs) - len(todo)} already recorded in {self.path}, "
                f"{len(todo)} to run ({'forked from a warm process' if self.server.warm_mode else 'fresh interpreters'})"
            )
            for r in self.plan.refused[:10]:
                self.echo(f"  refused: {' + '.join(r.names) or '(none)'}: {r.reason}")
            if len(self.plan.refused) > 10:
                self.echo(
                    f"  ... and {len(self.plan.refused) - 10} more refused combinations (listed in ablation.md)"
                )
            if self.plan.design and self.plan.mode == "factorial":
                self.echo(f"  design: {self.plan.design}")
        notes: list[str] = []
        if not self._run_jobs(todo, len(jobs)):
            notes.append(
                f"Budget of {self.clock.seconds:g} s spent after {self.clock.spent:.0f} s: "
                "the runs planned after that were not started."
            )
            return notes
        if until_resolved:
            notes += self._until_resolved(repeats)
        return notes

    def _until_resolved(self, repeats: int) -> list[str]:
        rounds = 0
        while True:
            results = self.results()  # read once per round
            analysis = results.analysis()
            unresolved = [v for v in self.plan.variants if v.name in analysis.unresolved]
            if not unresolved:
                return [
                    f"Resolved: every variant's interval excludes 1.0 or is within "
                    f"±{self.judge['resolution']:.0%} (after {rounds} added round(s))."
                ]
            names = ", ".join(v.name for v in unresolved)
            reference = self.plan[self.plan.baseline]
            repeat = max([int(r["repeat"]) for r in results.records] + [repeats]) + 1
            round_ = [(repeat, self.plan.variants.index(v), v) for v in (reference, *unresolved)]
            estimate = sum(_typical_elapsed(results, v) for _, _, v in round_)
            if not self.clock.fits(estimate):
                return [
                    f"Unresolved when the budget ({self.clock.seconds:g} s) ran out after "
                    f"{self.clock.spent:.0f} s and {rounds} added round(s) (the next would take about "
                    f"{estimate:.0f} s): {names}."
                ]
            if self.echo:
                self.echo(f"round {repeat} (until resolved): {reference.name} and {names}")
            if not self._run_jobs(round_, len(round_)):
                return [
                    f"Unresolved when the budget ({self.clock.seconds:g} s) ran out during round {repeat}: "
                    f"{names}."
                ]
            rounds += 1

    def _run_jobs(self, todo: Sequence[tuple[int, int, Variant]], total: int) -> bool:
        """Run ``todo`` in order; False when the budget stopped it early."""
        bar = _bar(total, total - len(todo), self.progress, self.echo)
        try:
            for repeat, index, variant in todo:
                if self.clock.over:
                    return False
                bar.set_postfix_str(f"{variant.name} (repeat {repeat})")
                log, report_path = run_paths(self.runs_dir, index, variant, repeat)
                cmd = self.tgt.command(self.python, variant.description, report_path)
                outcome = run_one(self.server, cmd, self.timeout, log, report_path)
                store.append(
                    self.path,
                    {
                        "variant": variant.name,
                        "variant_index": index,
                        "note": variant.note,
                        "pipeline": repr(variant.pipeline),
                        "pipeline_description": variant.description,
                        "repeat": repeat,
                        "command": cmd,
                        "config": self.tgt.config,
                        "target": self.tgt.spec,
                        "args": list(self.tgt.args),
                        "kwargs": self.tgt.kwargs,
                        "mode": self.plan.mode,
                        "baseline": self.plan.baseline,
                        "log": str(log),
                        "isolation": "fork" if self.server.warm_mode else "exec",
                        "plan": {
                            "factors": list(self.plan.factors),
                            "design": self.plan.design,
                            "refused": [[list(r.names), r.reason] for r in self.plan.refused],
                        },
                        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                            timespec="seconds"
                        ),
                        **outcome,
                    },
                )
                bar.update(1)
                if self.echo:
                    bar.write(_line(variant, repeat, outcome, self.judge["figure"]))
        finally:
            bar.close()
        return True


def _typical_elapsed(results: Results, variant: Variant) -> float:
    times = sorted(float(r.get("elapsed_s") or 0) for r in results.runs_of(variant))
    return times[len(times) // 2] if times else 0.0


def _line(variant: Variant, repeat: int, outcome: Mapping[str, Any], figure: str) -> str:
    if outcome["status"] != "ok":
        return f"  {variant.name} (repeat {repeat}): {outcome['status']}: {headline(outcome['error'])[:200]}"
    value = outcome["report"].get(figure)
    shown = f"{value:.3g}" if isinstance(value, (int, float)) else "n/a"
    return f"  {variant.name} (repeat {repeat}): ok, {figure} {shown}, run {outcome['elapsed_s']:.0f} s"


class _NoBar:
    def __init__(self, echo: Callable[[str], None] | None) -> None:
        self.echo = echo

    def set_postfix_str(self, _: str) -> None: ...

    def update(self, _: int) -> None: ...

    def write(self, text: str) -> None:
        if self.echo:
            self.echo(text)

    def close(self) -> None: ...


def _bar(total: int, initial: int, enabled: bool, echo: Callable[[str], None] | None) -> Any:
    if not enabled:
        return _NoBar(echo)
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with the [examples] and [test] extras
        return _NoBar(echo)
    return tqdm(total=total, initial=initial, unit="run", desc="ablation", dynamic_ncols=True)
