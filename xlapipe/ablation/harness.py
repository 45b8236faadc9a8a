"""``xlapipe ablate``'s part inside a script it runs unchanged: the harness the session calls.

The runner starts the script with ``XLAPIPE_HARNESS=xlapipe.ablation.harness:harness``
and ``XLAPIPE_ABLATION`` holding a job (JSON): ``{"report": PATH, "pipeline":
DESCRIPTION | null, "discover": bool, "warmup": N, "imports": [MODULE, ...]}``.
:func:`xlapipe.session` hands every setup it opens to :func:`harness`, which

- with ``discover``: writes the pipeline the script applied (``setup.applied``)
  to ``report`` as ``{"outline": OUTLINE}`` (its description with each
  transform's relations; or ``{"error": WHY}`` when a
  parameter cannot be described) and stops the script
  (:class:`Discovered`, a ``SystemExit`` with status 0) before anything
  touches the device;
- otherwise: imports the ``imports`` (``xlapipe ablate --import``: modules
  that register practices of the user's own, which the script itself may not
  import), applies the job's pipeline (the variant) to the setup as the
  user built it (``setup.base``, with what the script changed after its
  pipeline, such as a scheduler), and, in the first session of the process,
  :func:`~xlapipe.ablation.measure.measured` too: the session measures the run
  and writes the report.

A function defined in the script (in ``__main__``), e.g. ``log_every(to=show)``,
is described as ``"__main__:show"`` and found again in the script's own module
when the variant is rebuilt, in the script's own process.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from xlapipe.pipeline import Pipeline
from xlapipe.transform import Transform, rebuild

if TYPE_CHECKING:  # the driver imports this module for job_env: it stays torch-free
    from xlapipe.training_setup import TrainingSetup

HARNESS = "xlapipe.ablation.harness:harness"
JOB = "XLAPIPE_ABLATION"
MAIN = "__main__:"
USER_FIELDS = ("model", "optimizer", "scheduler", "loaders")  # what the user builds and may change later


class Discovered(SystemExit):
    """The script's pipeline is written: the script stops here (exit status 0)."""

    def __init__(self) -> None:
        super().__init__(0)


def job_env(
    report: str,
    pipeline: Sequence[Mapping[str, Any]] | None,
    warmup: int,
    discover: bool,
    imports: Sequence[str] = (),
) -> dict:
    """The environment that makes a script's sessions run ``pipeline`` (None: its own) and measure it."""
    job = {
        "report": report,
        "pipeline": pipeline,
        "warmup": warmup,
        "discover": discover,
        "imports": list(imports),
    }
    return {"XLAPIPE_HARNESS": HARNESS, JOB: json.dumps(job)}


_measuring = {"pid": -1}  # the process whose first session is measured


def harness(setup: TrainingSetup) -> TrainingSetup:
    """What the session trains instead of ``setup`` (see the module's docstring)."""
    job = json.loads(os.environ[JOB])
    if job["discover"]:
        try:
            found: dict[str, Any] = {"outline": outline(_transforms(setup))}  # the description and relations
        except ValueError as error:
            found = {"error": str(error)}
        with open(job["report"], "w") as f:
            json.dump(found, f)
        raise Discovered
    import_modules(job.get("imports", ()))  # practices of the user's own that the variant names
    variant = Pipeline(*_transforms(setup)) if job["pipeline"] is None else rebuild_in_script(job["pipeline"])
    out = variant(with_user_changes(setup))
    if _measuring["pid"] != os.getpid():  # the first session in this process
        from xlapipe.ablation.measure import measured

        _measuring["pid"] = os.getpid()
        out = measured(job["report"], job["warmup"])(out)
    return out


def _transforms(setup: TrainingSetup) -> tuple[Transform, ...]:
    return cast("tuple[Transform, ...]", setup.applied)


def with_user_changes(setup: TrainingSetup) -> TrainingSetup:
    """``setup.base`` with what the script set after applying its pipeline (a scheduler, say).

    A field the pipeline leaves as the user built it, but that ``setup`` holds
    otherwise, was changed after the pipeline: it is carried over.
    """
    base = setup.base
    replayed = Pipeline(*_transforms(setup))(base)
    changes = {
        name: getattr(setup, name)
        for name in USER_FIELDS
        if _same(getattr(replayed, name), getattr(base, name))
        and not _same(getattr(setup, name), getattr(base, name))
    }
    return base.evolve(**changes) if changes else base


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):  # loaders: rebuilt as a new mapping on every evolve
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return a is b


def describe(transforms: Sequence[Transform]) -> list[dict[str, Any]]:
    """The description of ``transforms``, a function of the script itself as ``"__main__:name"``."""
    return [{"name": t.name, "params": {k: _plain(v, t.name, k) for k, v in t.params}} for t in transforms]


def outline(transforms: Sequence[Transform]) -> list[dict[str, Any]]:
    """:func:`describe` with each transform's relations: what the driver plans with."""
    return [{**d, **t.relations()} for t, d in zip(transforms, describe(transforms))]


def _plain(value: Any, owner: str, key: str) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v, owner, key) for v in value]
    if not callable(value):
        return value
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or "<" in name or inspect.ismethod(value):
        raise ValueError(
            f"{owner}'s parameter {key!r} is {name or value!r}, which another process cannot find again: "
            "define it at the top level of the script or of a module"
        )
    return f"{module}:{name}"


def import_modules(names: Sequence[str]) -> None:
    """Import modules that register transforms of their own (the current folder is searched)."""
    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"cannot import {name!r} (to register its transforms): {error}") from None


def rebuild_in_script(description: Sequence[Mapping[str, Any]]) -> Pipeline:
    """The pipeline ``description`` names, a ``"__main__:name"`` parameter read from the running script."""
    main = sys.modules.get("__main__")
    return Pipeline(
        *(
            rebuild(item["name"], {k: _found(v, main) for k, v in item.get("params", {}).items()})
            for item in description
        )
    )


def _found(value: Any, main: Any) -> Any:
    if isinstance(value, list):
        return [_found(v, main) for v in value]
    if (
        isinstance(value, str)
        and value.startswith(MAIN)
        and callable(getattr(main, value[len(MAIN) :], None))
    ):
        return getattr(main, value[len(MAIN) :])
    return value
