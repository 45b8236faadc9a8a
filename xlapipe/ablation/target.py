"""What an ablation runs: a workload script or a function, its command line, its full pipeline."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from xlapipe import runtime
from xlapipe._convert import strs
from xlapipe.ablation.results import config_key
from xlapipe.ablation.variants import check_description
from xlapipe.pipeline import Pipeline

RESERVED = ("--pipeline", "--report", "--print-pipeline")


@frozen
class Target:
    """What to ablate: a workload script (run as is) or a function (run by the worker)."""

    spec: str
    kind: str  # "script" or "function"
    args: tuple[str, ...] = field(default=(), converter=strs)
    kwargs: dict[str, Any] = field(factory=dict)

    def command(self, python: str, description: list, report: str | os.PathLike) -> list[str]:
        """The command line that runs this target on one pipeline."""
        pipeline = json.dumps(description, separators=(",", ":"))
        if self.kind == "script":
            return [python, self.spec, *self.args, "--pipeline", pipeline, "--report", str(report)]
        return [
            python,
            "-m",
            "xlapipe.ablation.worker",
            "--function",
            self.spec,
            "--pipeline",
            pipeline,
            "--report",
            str(report),
            "--kwargs",
            json.dumps(self.kwargs),
        ]

    @property
    def config(self) -> str:
        return config_key(self.spec, self.args, self.kwargs)


def resolve_target(
    target: str | Callable, args: Sequence[str] = (), kwargs: Mapping[str, Any] | None = None
) -> Target:
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


def refuse_function_print(target: Target) -> None:
    if target.kind != "script":
        raise ValueError(
            f"a function target ({target.spec}) cannot print its pipeline: give the full "
            "pipeline (pipeline=..., CLI: --pipeline JSON)"
        )


def print_pipeline(target: Target, python: str, env: Mapping[str, str], timeout: float = 600) -> Pipeline:
    """Ask a workload script for the pipeline its flags select (``--print-pipeline``), in a fresh process."""
    refuse_function_print(target)
    cmd = [python, target.spec, *target.args, "--print-pipeline"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(env), timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return parse_printed_pipeline(cmd, done.stdout)


def parse_printed_pipeline(cmd: Sequence[str], stdout: str) -> Pipeline:
    """The pipeline description (a JSON list) a script printed for ``--print-pipeline``."""
    for text in (stdout, *reversed(stdout.strip().splitlines())):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            return as_pipeline(value)
    raise RuntimeError(
        f"{' '.join(cmd)} printed no pipeline description (a JSON list); its output was:\n{stdout[-2000:]}"
    )


def as_pipeline(value: Pipeline | str | Sequence[Any]) -> Pipeline:
    """A pipeline from a Pipeline, its description, or that description as JSON text."""
    if isinstance(value, Pipeline):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"the pipeline is not valid JSON ({error})") from None
    return Pipeline.from_description(check_description(value, "the pipeline"))
