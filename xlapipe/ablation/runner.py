"""Run every variant of an ablation in its own fresh process, with a timeout, resumably.

Repeats are interleaved (repeat 1 of every variant, then repeat 2, ...), so a
slow spell on a shared machine spreads over all variants instead of hitting
one. Each finished run is appended to ``OUT/results.jsonl`` at once.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xlapipe import runtime
from xlapipe.ablation import results as store
from xlapipe.ablation.report import write_all
from xlapipe.ablation.results import Results
from xlapipe.ablation.variants import Plan, Variant, plan as make_plan
from xlapipe.pipeline import Pipeline

RESERVED = ("--pipeline", "--report", "--print-pipeline")


@frozen
class Target:
    """What to ablate: a workload script (run as is) or a function (run by the worker)."""

    spec: str
    kind: str  # "script" or "function"
    args: tuple[str, ...] = field(default=(), converter=tuple)
    kwargs: dict[str, Any] = field(factory=dict)

    def command(self, python: str, description: list, report: str | os.PathLike) -> list[str]:
        """The command line that runs this target on one pipeline."""
        pipeline = json.dumps(description, separators=(",", ":"))
        if self.kind == "script":
            return [python, self.spec, *self.args, "--pipeline", pipeline, "--report", str(report)]
        return [python, "-m", "xlapipe.ablation.worker", "--function", self.spec,
                "--pipeline", pipeline, "--report", str(report), "--kwargs", json.dumps(self.kwargs)]

    @property
    def config(self) -> str:
        return store.config_key(self.spec, self.args, self.kwargs)


def resolve_target(target: str | Callable, args: Sequence[str] = (), kwargs: Mapping[str, Any] | None = None) -> Target:
    """A script path, ``module:function``, ``file.py:function``, or an importable function."""
    if callable(target):
        module = getattr(target, "__module__", None)
        if not module or module == "__main__" or "<locals>" in target.__qualname__:
            raise ValueError(
                f"{target!r} cannot be imported by a fresh process: define it at the top "
                "level of an importable module, or pass 'module:function'"
            )
        target = f"{module}:{target.__qualname__}"
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must be a script path or 'module:function', got {target!r}")
    head, sep, attr = target.rpartition(":")
    if sep and head and attr.replace(".", "_").isidentifier() and not os.path.exists(target):
        if args:
            raise ValueError(
                "arguments after -- are for script targets; give a function's keyword "
                "arguments as kwargs={...} (CLI: --kwargs JSON)"
            )
        return Target(target, "function", (), dict(kwargs or {}))
    if not os.path.isfile(target):
        raise FileNotFoundError(
            f"no workload script {target!r}; give a path to a script that follows the "
            "workload contract (docs/ablation.md), or 'module:function'"
        )
    if kwargs:
        raise ValueError("kwargs are for function targets; pass a script's options as args after --")
    clash = [a for a in args if a.split("=")[0] in RESERVED]
    if clash:
        raise ValueError(
            f"the runner sets {', '.join(RESERVED)} itself; remove {', '.join(clash)} from the script "
            "arguments (choose the full pipeline with xlapipe ablate --pipeline JSON)"
        )
    return Target(target, "script", tuple(args))


def import_modules(names: Sequence[str]) -> None:
    """Import modules that register transforms of their own (the current folder is searched)."""
    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"cannot import {name!r} (to register its transforms): {error}") from None


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every run: ours, plus ``extra``, plus a PJRT device."""
    env = {**os.environ, **(extra or {})}
    env.setdefault("PJRT_DEVICE", runtime.default_pjrt_device())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def print_pipeline(target: Target, python: str, env: Mapping[str, str], timeout: float = 600) -> Pipeline:
    """Ask a workload script for the pipeline its flags select (``--print-pipeline``)."""
    if target.kind != "script":
        raise ValueError(
            f"a function target ({target.spec}) cannot print its pipeline: give the full "
            "pipeline (pipeline=..., CLI: --pipeline JSON)"
        )
    cmd = [python, target.spec, *target.args, "--print-pipeline"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(env), timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    for text in (done.stdout, *reversed(done.stdout.strip().splitlines())):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            return as_pipeline(value)
    raise RuntimeError(
        f"{' '.join(cmd)} printed no pipeline description (a JSON list); its output was:\n{done.stdout[-2000:]}"
    )


def as_pipeline(value: Pipeline | str | Sequence[Any]) -> Pipeline:
    """A pipeline from a Pipeline, its description, or that description as JSON text."""
    if isinstance(value, Pipeline):
        return value
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list):
        raise ValueError(f"a pipeline description is a JSON list of {{'name', 'params'}}, got {value!r}")
    return Pipeline.from_description(value)


def _slug(index: int, name: str) -> str:
    return f"{index:02d}-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:60] or "variant")


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def run_one(cmd: Sequence[str], timeout: float, env: Mapping[str, str], log: Path, report: Path) -> dict[str, Any]:
    """Run ``cmd`` in its own process group; status ok/error/timeout, error text, report, time."""
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return {"status": "timeout", "returncode": None, "report": None, "pid": proc.pid,
                    "elapsed_s": time.perf_counter() - start,
                    "error": f"timed out after {timeout:g} s; last output:\n{_tail(log)}"}
        except BaseException:  # Ctrl-C: take the run down with us, record nothing
            _kill(proc)
            raise
    elapsed = time.perf_counter() - start
    if code != 0:
        return {"status": "error", "returncode": code, "report": None, "elapsed_s": elapsed, "pid": proc.pid,
                "error": f"exit code {code}; last output:\n{_tail(log)}"}
    try:
        data = json.loads(report.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"the report is a {type(data).__name__}, not a JSON object")
    except (OSError, ValueError) as error:
        return {"status": "error", "returncode": code, "report": None, "elapsed_s": elapsed, "pid": proc.pid,
                "error": f"exited 0 but wrote no readable report to {report} ({error}); "
                         "a workload must honour --report PATH"}
    return {"status": "ok", "returncode": 0, "report": data, "elapsed_s": elapsed, "error": "", "pid": proc.pid}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def schedule(plan: Plan, repeats: int) -> list[tuple[int, int, Variant]]:
    """(repeat, index, variant) in round-robin order: every variant once, then again."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    return [(r, i, v) for r in range(1, repeats + 1) for i, v in enumerate(plan.variants)]


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
    figure: str = "epoch_s",
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
    """
    import_modules(imports)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive (seconds), got {timeout}")
    python = python or sys.executable
    tgt = resolve_target(target, args, kwargs)
    environ = child_env(env)
    if pipeline is not None:
        full: Pipeline | None = as_pipeline(pipeline)
    elif mode == "explicit":
        full = None
    else:
        full = print_pipeline(tgt, python, environ)
    the_plan = make_plan(mode, full, baseline=baseline, factors=factors, order=order,
                         cumulative=cumulative, variants=variants).with_baseline(reference)
    out = Path(out)
    path = out / store.RESULTS_FILE
    _run_all(the_plan, tgt, repeats, out, timeout, python, environ, retry_failed, progress, figure, echo)
    records = [r for r in store.load(path) if r.get("config") == tgt.config]
    res = Results(the_plan.variants, the_plan.baseline, records, figure, the_plan.mode, the_plan.refused, str(out))
    write_all(res, out)
    return res


def _run_all(the_plan: Plan, tgt: Target, repeats: int, out: Path, timeout: float, python: str,
             environ: Mapping[str, str], retry_failed: bool, progress: bool, figure: str,
             echo: Callable[[str], None] | None) -> None:
    """Run what is not recorded yet, round robin, appending each outcome as it finishes."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = out / store.RESULTS_FILE
    settled = {"ok"} if retry_failed else {"ok", "error", "timeout"}
    done = {store.record_key(r) for r in store.load(path) if r.get("status") in settled}
    jobs = schedule(the_plan, repeats)
    todo = [j for j in jobs if (j[2].key, tgt.config, j[0]) not in done]
    if echo:
        echo(f"ablation ({the_plan.mode}) of {tgt.spec}: {len(the_plan.variants)} variants x {repeats} "
             f"repeat(s); {len(jobs) - len(todo)} already recorded in {path}, {len(todo)} to run")
        for r in the_plan.refused[:10]:
            echo(f"  refused: {' + '.join(r.names) or '(none)'}: {r.reason}")
        if len(the_plan.refused) > 10:
            echo(f"  ... and {len(the_plan.refused) - 10} more refused combinations (listed in ablation.md)")
    bar = _bar(len(jobs), len(jobs) - len(todo), progress, echo)
    try:
        for repeat, index, variant in todo:
            bar.set_postfix_str(f"{variant.name} (repeat {repeat})")
            stem = f"{_slug(index, variant.name)}.r{repeat}"
            report_path, log = (runs_dir / f"{stem}.json").resolve(), runs_dir / f"{stem}.log"
            cmd = tgt.command(python, variant.description, report_path)
            outcome = run_one(cmd, timeout, environ, log, report_path)
            store.append(path, {
                "variant": variant.name, "variant_index": index, "note": variant.note,
                "pipeline": repr(variant.pipeline), "pipeline_description": variant.description,
                "repeat": repeat, "command": cmd, "config": tgt.config, "target": tgt.spec,
                "args": list(tgt.args), "kwargs": tgt.kwargs, "mode": the_plan.mode,
                "baseline": the_plan.baseline, "log": str(log),
                "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                **outcome,
            })
            bar.update(1)
            if echo:
                bar.write(_line(variant, repeat, outcome, figure))
    finally:
        bar.close()


def _line(variant: Variant, repeat: int, outcome: Mapping[str, Any], figure: str) -> str:
    if outcome["status"] != "ok":
        last = (outcome["error"].strip().splitlines() or [""])[-1]
        return f"  {variant.name} (repeat {repeat}): {outcome['status']}: {last[:200]}"
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
