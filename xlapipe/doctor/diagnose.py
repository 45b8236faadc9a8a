"""Run a script under the probe and diagnose it: the findings, the setup, the suggested pipeline."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from attrs import define, evolve, field

from xlapipe import child_process
from xlapipe.doctor import child
from xlapipe.doctor.checks import optimizer, run_all, step_marker, worst_first
from xlapipe.doctor.checks.environment import setup_info
from xlapipe.doctor.events import Frame, Record, read_events, read_graphs, trace_files
from xlapipe.doctor.findings import Context, Finding, plural
from xlapipe.doctor.frames import Libraries, short, source, user_frame
from xlapipe.doctor.stacks import where_stopped
from xlapipe.doctor.suggest import Suggestion, suggest
from xlapipe.doctor.timeline import Timeline, build

_OUTPUT_TAIL = 15


@define
class Diagnosis:
    """What ``xlapipe doctor`` found in one run of a script."""

    script: str
    args: list[str]
    steps_asked: int
    warmup: int
    status: str  # child.Outcome.status, "no steps", or "no marker" (updates, no step marker)
    steps: int  # steps the script made
    elapsed_s: float
    findings: list[Finding] = field(factory=list)
    setup: dict[str, Any] = field(factory=dict)
    suggestion: Suggestion | None = None
    message: str = ""  # what went wrong ('' when the script made the steps asked)
    timing: dict[str, float] = field(factory=dict)
    overhead: dict[str, float] | None = None

    @property
    def ok(self) -> bool:
        """Diagnosed: the script made the steps asked, or updated its model with no step marker at all."""
        return self.status in ("steps", "no marker")

    def to_json(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "args": self.args,
            "status": self.status,
            "ok": self.ok,
            "message": self.message,
            "steps": self.steps,
            "steps_asked": self.steps_asked,
            "warmup": self.warmup,
            "elapsed_s": round(self.elapsed_s, 3),
            "timing": self.timing,
            "overhead": self.overhead,
            "findings": [f.to_json() for f in self.findings],
            "setup": self.setup,
            "suggested_pipeline": None if self.suggestion is None else self.suggestion.description,
            "suggested_pipeline_python": None if self.suggestion is None else self.suggestion.python,
        }


def check_script(script: str) -> None:
    """Refuse a script that cannot be run, saying what to give instead."""
    if not os.path.exists(script):
        raise FileNotFoundError(
            f"no script {script!r} (looked in {os.getcwd()}): give the path of your training script"
        )
    if os.path.isdir(script):
        raise ValueError(
            f"{script!r} is a folder: give the training script's file (python would run {script}/__main__.py)"
        )
    if not os.access(script, os.R_OK):
        raise ValueError(f"cannot read {script!r}: check its permissions")


def diagnose(
    script: str,
    args: Sequence[str] = (),
    *,
    steps: int = 20,
    warmup: int = 3,
    timeout: float = 600.0,
    python: str = sys.executable,
    overhead: bool = False,
    keep: str | None = None,
) -> Diagnosis:
    """Run ``python SCRIPT ARGS`` for at most ``steps`` steps in a fresh process and diagnose it.

    ``keep``: a folder to copy the run's raw files to (torch_xla's traces and
    graphs, the script's output); they are removed otherwise.
    """
    check_script(script)
    if warmup < 1 or steps < warmup + 2:
        raise ValueError(
            f"--steps {steps} with --warmup {warmup}: the doctor needs at least two steps after the "
            f"warm-up; give --steps {warmup + 2} or more"
        )
    with child_process.interruptible():
        folder = tempfile.mkdtemp(prefix="xlapipe-doctor-")
        try:
            outcome = child.run(script, args, folder=folder, steps=steps, timeout=timeout, python=python)
            diagnosis = _diagnose(outcome, script, list(args), steps, warmup, timeout)
            if keep:
                shutil.copytree(folder, keep, dirs_exist_ok=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if overhead and diagnosis.ok:
            diagnosis.overhead = measure_overhead(script, args, diagnosis, timeout=timeout, python=python)
    return diagnosis


def _trained(folder: str) -> tuple[int | None, dict[int, list]]:
    """The process that made the steps (the most), and every process's events."""
    events = {pid: read_events(path) for pid, path in trace_files(folder).items()}

    def steps(pid: int) -> int:
        return sum(
            1 for e in events[pid] if isinstance(e, Record) and e.kind == "marker_end" and e.data.get("step")
        )

    best = max(events, key=steps, default=None)
    return (best if best is not None and steps(best) else None), events


def _diagnose(
    outcome: child.Outcome, script: str, args: list[str], steps: int, warmup: int, timeout: float
) -> Diagnosis:
    pid, events = _trained(outcome.folder)
    records = [e for evs in events.values() for e in evs if isinstance(e, Record)]
    start = next((r for r in records if r.kind == "start"), None)
    libraries = Libraries.from_record(start.data.get("libraries") if start else None)
    cwd = str(start.data.get("cwd")) if start else os.getcwd()
    timeline = build(pid, events[pid], libraries) if pid is not None else Timeline(0, [], records, libraries)
    if pid is not None:
        timeline.graphs = read_graphs(outcome.folder, pid)
        timeline.records = records  # setup records may come from the parent of a forked replica
    practices = next((r.data.get("applied") for r in records if r.kind == "practices"), None)
    context = Context(timeline, warmup, cwd, practices)
    made = len(timeline.steps)
    diagnosis = Diagnosis(script, args, steps, warmup, outcome.status, made, outcome.elapsed_s)
    diagnosis.message = _message(outcome, timeline, records, steps, warmup, timeout, cwd)
    if made == 0 and outcome.status == "ended":
        diagnosis.status = "no steps"
    if made == 0 and events:
        most = max(events, key=lambda p: len(step_marker.updates(events[p])))
        no_marker = step_marker.check(events[most], libraries, warmup, cwd)
        if no_marker is not None:  # with what needs no step: an optimizer that trains nothing
            diagnosis.status, diagnosis.findings = "no marker", [*optimizer.check(context), no_marker]
            diagnosis.message = (
                "the script marked no step: the doctor counted its optimizer updates instead "
                f"({plural(len(step_marker.updates(events[most])), 'update')})"
                + (f"\n{diagnosis.message}" if outcome.status == "failed" else "")
            )
    if made > warmup:
        diagnosis.findings = run_all(context)
        diagnosis.findings = _merge_replicas(outcome.folder, pid, events, diagnosis.findings, context)
        diagnosis.suggestion = suggest(practices, diagnosis.findings)
        diagnosis.timing = {
            "step_s_median": round(context.median_step_s, 6),  # the figure findings quote
            "first_step_s": round(timeline.steps[0].step_s, 6),
            "measured_steps": len(context.measured),
        }
    diagnosis.setup = setup_info(context)
    return diagnosis


def _rank(events: list) -> int | None:
    runtime = next((e for e in events if isinstance(e, Record) and e.kind == "runtime"), None)
    rank = runtime.data.get("rank") if runtime is not None else None
    return int(rank) if isinstance(rank, int) else None


def _merge_replicas(
    folder: str, pid: int | None, events: dict[int, list], found: list[Finding], context: Context
) -> list[Finding]:
    """With replicas the script started (torch_xla.launch, xmp.spawn, fork): every replica that made
    steps past warm-up is diagnosed, and each finding says the ranks it was found in."""
    spawned = {
        p
        for p, evs in events.items()
        if any(isinstance(e, Record) and e.kind == "start" and e.data.get("spawned") for e in evs)
    }
    others = [p for p in events if p != pid and _steps(events[p]) > context.warmup]
    if pid is None or (not others and pid not in spawned):
        return found
    merged: dict[tuple[str, str], Finding] = {}
    replicas: list[tuple[int, list[Finding]]] = [(pid, found)]
    for other in others:
        timeline = build(other, events[other], context.timeline.libraries)
        timeline.graphs = read_graphs(folder, other)
        timeline.records = context.timeline.records
        replicas.append((other, run_all(Context(timeline, context.warmup, context.cwd, context.practices))))
    for process, findings in replicas:
        rank = _rank(events[process])
        for f in findings:
            key = (f.kind, f.where)  # one finding however its figures differ between replicas
            kept = merged.setdefault(key, f)
            ranks = set(kept.ranks if kept is not f else ()) | ({rank} if rank is not None else set())
            merged[key] = evolve(kept, ranks=tuple(sorted(ranks)))
    return worst_first(merged.values())


def _steps(events: list) -> int:
    return sum(1 for e in events if isinstance(e, Record) and e.kind == "marker_end" and e.data.get("step"))


def _message(
    outcome: child.Outcome,
    timeline: Timeline,
    records: list[Record],
    steps: int,
    warmup: int,
    timeout: float,
    cwd: str,
) -> str:
    made = len(timeline.steps)
    probe_error = next((r for r in records if r.kind == "probe_error"), None)
    if probe_error is not None:
        return f"the doctor's probe failed inside the script's process (a bug of the doctor): {probe_error.data.get('message')}"
    if outcome.status == "steps":
        return ""
    done = f"after {made} step{'s' if made != 1 else ''}" if made else "before its first step"
    partial = _partial(made, warmup)
    output = f"\n--- the last lines of its output ---\n{_tail(outcome.output)}"
    if outcome.status == "timeout":
        where = _hung_at(outcome, timeline, cwd)
        return (
            f"the script did not reach {steps} steps within {timeout:g} s (--timeout); it was stopped "
            f"{done}{', at ' + where if where else ''}. Give a longer --timeout if it is only slow."
            f"{output}{partial}"
        )
    if outcome.status == "failed":
        end = next((r for r in records if r.kind == "end" and r.data.get("error")), None)
        error = end.data["error"] if end else None
        where = ""
        if error:
            frames = [Frame(str(f[0]), int(f[1]), str(f[2])) for f in reversed(error.get("stack") or [])]
            frame = user_frame(frames, timeline.libraries)
            where = f" at {short(frame, cwd)} ({source(frame)})" if frame else ""
            what = f"{error.get('type')}: {error.get('message')}"
        else:
            what = f"exit status {outcome.returncode}"
        return f"the script failed {done}{where}: {what}{output}{partial}"
    started = _own_processes(records, timeline, cwd)
    if made == 0:
        instrumented = any(r.kind == "instrumented" for r in records)
        why = (
            ""
            if instrumented
            else " It never imported torch_xla: the doctor diagnoses torch_xla training scripts."
        )
        return (
            "the script ran to its end without a step marker that ran a graph (torch_xla.sync(), "
            "xm.mark_step(), an MpDeviceLoader batch, xm.optimizer_step(barrier=True), xlapipe's "
            f"run.step): the doctor counts steps by them, and there were none.{why}{started}{output}"
        )
    return (
        f"the script ended {done}, before the {steps} asked (--steps {steps}): ask for fewer steps, or "
        f"give the script more to do.{started}{output}{partial}"
    )


def _own_processes(records: list[Record], timeline: Timeline, cwd: str) -> str:
    """What to say of the processes the script started itself (subprocess), which the doctor does not
    follow ('' when it started none)."""
    started = [r for r in records if r.kind == "process"]
    if not started:
        return ""
    shown = []
    for r in started[:3]:
        frame = timeline.where(r.frames("stack"))
        shown.append(f"`{r.data.get('command')}`" + (f" at {short(frame, cwd)}" if frame else ""))
    more = f" and {len(started) - 3} more" if len(started) > 3 else ""
    return (
        f" It started {len(started)} process{'es' if len(started) != 1 else ''} of its own ({'; '.join(shown)}{more}), which "
        "the doctor does not follow (it follows torch_xla.launch and xmp.spawn): if the training "
        "runs there, run the doctor on what it runs (xlapipe doctor THAT_SCRIPT -- ARGS)."
    )


def _partial(made: int, warmup: int) -> str:
    if made > warmup:
        return (
            f"\nThe findings below cover the {plural(made - warmup, 'step')} after the {warmup}-step warm-up."
        )
    if made:
        return f"\nAll {made} steps made were warm-up (--warmup {warmup}): nothing was measured after it."
    return ""


def _tail(path: str) -> str:
    lines = child_process.tail(path, 200 * _OUTPUT_TAIL).splitlines()
    return "\n".join(lines[-_OUTPUT_TAIL:]) or "(no output)"


def _hung_at(outcome: child.Outcome, timeline: Timeline, cwd: str) -> str:
    frame = where_stopped(outcome.folder, timeline)
    return f"{short(frame, cwd)} ({source(frame)})" if frame else ""


def measure_overhead(
    script: str, args: Sequence[str], diagnosis: Diagnosis, *, timeout: float, python: str
) -> dict[str, float]:
    """The same script and steps with the step counter only: seconds per step against the diagnosed run."""
    folder = tempfile.mkdtemp(prefix="xlapipe-doctor-plain-")
    try:
        outcome = child.run(
            script,
            args,
            folder=folder,
            steps=diagnosis.steps_asked,
            timeout=timeout,
            python=python,
            mode="count",
        )
        pid, events = _trained(folder)
        if pid is None or outcome.status != "steps":
            return {}
        plain = build(pid, events[pid], Libraries()).steps[diagnosis.warmup :]
        plain_step = statistics.median(s.step_s for s in plain)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    probed = diagnosis.timing["step_s_median"]
    return {
        "plain_step_s_median": round(plain_step, 6),
        "probed_step_s_median": probed,
        "ratio": round(probed / plain_step, 3) if plain_step > 0 else float("nan"),
        "plain_run_s": round(outcome.elapsed_s, 3),
        "probed_run_s": round(diagnosis.elapsed_s, 3),
    }
