"""What an ablation runs: a script (unchanged, or following the contract) or a function; its command line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from xlapipe import runtime
from xlapipe._convert import strs
from xlapipe.ablation.harness import job_env
from xlapipe.ablation.results import config_key
from xlapipe.ablation.variants import check_description
from xlapipe.pipeline import Pipeline

RESERVED = ("--pipeline", "--report", "--print-pipeline")


KINDS = ("script", "contract", "function")


@frozen
class Target:
    """What to ablate: a script run unchanged, a script that follows the workload contract, or a function."""

    spec: str
    kind: str  # one of KINDS
    args: tuple[str, ...] = field(default=(), converter=strs)
    kwargs: dict[str, Any] = field(factory=dict)
    imports: tuple[str, ...] = field(default=(), converter=strs)  # modules that register practices

    def command(self, python: str, description: list, report: str | os.PathLike) -> list[str]:
        """The command line that runs this target on one pipeline (a script run unchanged: as given)."""
        pipeline = json.dumps(description, separators=(",", ":"))
        if self.kind == "script":
            return [python, self.spec, *self.args]
        if self.kind == "contract":
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
            *(arg for name in self.imports for arg in ("--import", name)),
        ]

    def env(self, description: list | None, report: str | os.PathLike, warmup: int) -> dict[str, str]:
        """What the run's environment adds: for a script run unchanged, the harness and its job."""
        if self.kind != "script":
            return {}
        return job_env(str(report), description, warmup, discover=False, imports=self.imports)

    def discovery(self, python: str, report: str | os.PathLike) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run the script up to its pipeline, and stop it there."""
        if self.kind == "contract":
            return [python, self.spec, *self.args, "--print-pipeline"], {}
        return [python, self.spec, *self.args], job_env(str(report), None, 0, discover=True)

    @property
    def config(self) -> str:
        return config_key(self.spec, self.args, self.kwargs)


def resolve_target(
    target: str | Callable, args: Sequence[str] | Mapping[str, Any] = (), contract: bool = False
) -> Target:
    """A script path, ``module:function``, ``file.py:function``, or an importable function.

    ``args`` are a script's command-line arguments, or a function's keyword
    arguments (a mapping). A script runs unchanged unless ``contract`` says it
    follows the workload contract.
    """
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
        if isinstance(args, str) or not isinstance(args, Mapping):
            if args:
                raise ValueError(
                    "a function target takes its keyword arguments as a mapping (args={...}; "
                    "CLI: --kwargs JSON), not command-line arguments after --"
                )
            args = {}
        return Target(target, "function", (), dict(args))
    if not os.path.isfile(target):
        raise FileNotFoundError(
            f"no script {target!r}; give a path to a training script (run unchanged, or with --contract "
            "if it follows the workload contract, docs/ablation.md), or 'module:function'"
        )
    if isinstance(args, Mapping):
        if args:
            raise ValueError(
                "keyword arguments (--kwargs) are for function targets; pass a script's "
                "options as arguments after --"
            )
        args = ()
    clash = [a for a in args if a.split("=")[0] in RESERVED] if contract else []
    if clash:
        raise ValueError(
            f"the runner sets {', '.join(RESERVED)} itself; remove {', '.join(clash)} from the script "
            "arguments (choose the full pipeline with xlapipe ablate --pipeline JSON)"
        )
    return Target(target, "contract" if contract else "script", tuple(args))


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every run: ours, plus ``extra``, plus a PJRT device."""
    env = {**os.environ, **(extra or {})}
    env.setdefault("PJRT_DEVICE", runtime.default_pjrt_device())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def parse_printed_pipeline(cmd: Sequence[str], stdout: str) -> list[Any]:
    """The pipeline description (a JSON list) a script printed for ``--print-pipeline``."""
    for text in (stdout, *reversed(stdout.strip().splitlines())):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            return check_description(value, "the pipeline")
    raise RuntimeError(
        f"{' '.join(cmd)} printed no pipeline description (a JSON list); its output was:\n{stdout[-2000:]}"
    )


def as_description(value: Pipeline | str | Sequence[Any]) -> Pipeline | list[Any]:
    """A pipeline as given (a Pipeline), or its description checked for shape (from JSON text too)."""
    if isinstance(value, Pipeline):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"the pipeline is not valid JSON ({error})") from None
    return check_description(value, "the pipeline")
