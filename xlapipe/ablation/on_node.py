"""One run of an ablation on the machine it runs on: the standard library only.

:class:`~xlapipe.ablation.engines.Local` calls :func:`run_here` on this machine.
On a Ray cluster, Ray sends these functions by value (see
:mod:`xlapipe.ablation.fleet`), so the Ray worker that runs them never imports
xlapipe or torch (half a minute on a busy host): it loads the machine's own
:mod:`xlapipe.child_process` from its file, and the run is a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any

REPORT = "/.xlapipe-report-on-the-machine.json"  # in the driver's command, replaced by the run's report path
LOG_TAIL = 256 * 1024  # characters of a run's log sent back to the driver
ERROR_TAIL = 3000  # characters of a failed run's log kept in its record


def _package() -> Path | None:
    """This machine's xlapipe package folder, found without importing it."""
    spec = importlib.util.find_spec("xlapipe")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _child_process() -> ModuleType:
    """:mod:`xlapipe.child_process`: the one imported here, else loaded from its file (xlapipe not imported)."""
    loaded = sys.modules.get("xlapipe.child_process")
    if loaded is not None:
        return loaded
    package = _package()
    if package is None:
        raise RuntimeError(f"xlapipe is not installed for {sys.executable} on {socket.gethostname()}")
    name = "_xlapipe_child_process"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, package / "child_process.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def check_here(paths: Sequence[str], cwd: str, modules: Sequence[str] = ()) -> dict[str, Any]:
    """This machine's host name and what the runs need that it lacks (xlapipe, ``cwd``, ``paths`` in it,
    the ``--import`` ``modules``, found from ``cwd`` as a run finds them, without importing them)."""
    base = Path(cwd)
    missing = [p for p in [cwd, *paths] if not (base / p).exists()]
    if _package() is None:
        missing.append(f"xlapipe (in {sys.executable})")
    missing += [f"module {m!r} (--import) from {cwd}" for m in modules if not _findable(m, cwd)]
    return {"host": socket.gethostname(), "missing": missing}


def _findable(module: str, cwd: str) -> bool:
    """Whether ``module``'s top-level package is importable from ``cwd`` or the path (nothing of it
    is run, and what this process has imported already does not count)."""
    top = module.partition(".")[0]
    return top in sys.builtin_module_names or PathFinder.find_spec(top, [cwd, *sys.path]) is not None


def run_here(
    cmd: list[str],
    env: dict[str, str],
    limit: float,
    cwd: str | None,
    log: Path,
    report: Path,
    orphaned: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``cmd`` with the environment ``env`` until it ends or ``limit`` seconds pass; the record's outcome.

    Status ``ok`` (exit 0 and a report), ``error`` (with why: the exit code or
    signal and the end of the log, or no readable report) or ``timeout`` (with
    its limit, ``limit_s``, and whatever report it wrote before it was killed).
    """
    cp = _child_process()
    done = cp.run(cmd, log=log, env=env, cwd=cwd, limit=limit, result=report, orphaned=orphaned)
    base: dict[str, Any] = {"pid": done.pid, "elapsed_s": done.elapsed_s}
    if done.leftovers:
        base["leftovers_killed"] = done.leftovers
    if done.status == "timeout":
        return {
            **base,
            "status": "timeout",
            "returncode": None,
            "report": done.result,
            "limit_s": limit,
            "error": f"timed out after {limit:g} s; last output:\n{done.tail(ERROR_TAIL)}",
        }
    if done.returncode != 0:
        return {
            **base,
            "status": "error",
            "returncode": done.returncode,
            "report": None,
            "error": f"{cp.exit_text(done.returncode)}; last output:\n{done.tail(ERROR_TAIL)}",
        }
    if done.result is None:
        return {
            **base,
            "status": "error",
            "returncode": 0,
            "report": None,
            "error": f"exited 0 but wrote no readable report to {report} ({done.result_error}); "
            "a workload must honour --report PATH, and a script run unchanged must train in xp.session",
        }
    return {**base, "status": "ok", "returncode": 0, "report": done.result, "error": ""}


def run_on_machine(
    cmd: list[str], added: dict[str, str], limit: float, cwd: str, node: str
) -> dict[str, Any]:
    """A Ray task: run ``cmd`` (its interpreter: this worker's) here; its outcome and the end of its log."""
    with tempfile.TemporaryDirectory(prefix="xlapipe-run-") as tmp:
        log, report = Path(tmp) / "run.log", Path(tmp) / "report.json"
        here = [sys.executable, *(a.replace(REPORT, str(report)) for a in cmd[1:])]
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # Ray's 1, not the run's
        env.update({k: v.replace(REPORT, str(report)) for k, v in added.items()})
        env.update(XLAPIPE_MACHINE=node, PYTHONUNBUFFERED="1")
        outcome = run_here(here, env, limit, cwd, log, report, orphaned=[tmp])  # a cancelled task too
        text = _child_process().tail(log, LOG_TAIL)
    outcome["error"] = outcome.get("error", "").replace(str(report), "(the run's report)")
    return {"outcome": outcome, "log": text}
