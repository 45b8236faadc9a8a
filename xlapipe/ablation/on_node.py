"""What runs on a machine of a Ray cluster for an ablation: the standard library only.

Ray sends these functions by value (see :mod:`xlapipe.ablation.fleet`), so the
Ray worker that runs them never imports xlapipe or torch (half a minute on a
busy host); the run itself is a fresh interpreter, started by the machine's own
copy of xlapipe's process server (``processes.py``, loaded from its file).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT = "/.xlapipe-report-on-the-machine.json"  # in the driver's command, replaced by the run's report path
LOG_TAIL = 256 * 1024  # bytes of a run's log sent back to the driver


def _package() -> Path | None:
    """This machine's xlapipe package folder, found without importing it."""
    spec = importlib.util.find_spec("xlapipe")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def check_here(paths: Sequence[str], cwd: str) -> dict[str, Any]:
    """This machine's host name and what the runs need that it lacks (xlapipe, ``cwd``, ``paths`` in it)."""
    base = Path(cwd)
    missing = [p for p in [cwd, *paths] if not (base / p).exists()]
    if _package() is None:
        missing.append(f"xlapipe (in {sys.executable})")
    return {"host": socket.gethostname(), "missing": missing}


def run_here(cmd: list[str], env: dict[str, str], limit: float, cwd: str, node: str) -> dict[str, Any]:
    """Run ``cmd`` (its interpreter: this worker's) as a fresh process; its outcome and the end of its log."""
    package = _package()
    if package is None:
        raise RuntimeError(f"xlapipe is not installed for {sys.executable} on {socket.gethostname()}")
    spec = importlib.util.spec_from_file_location("_xlapipe_processes", package / "ablation" / "processes.py")
    assert spec is not None and spec.loader is not None
    processes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(processes)
    with tempfile.TemporaryDirectory(prefix="xlapipe-run-") as tmp:
        log, report = Path(tmp) / "run.log", Path(tmp) / "report.json"
        here = [sys.executable, *(a.replace(REPORT, str(report)) for a in cmd[1:])]
        added = {k: v.replace(REPORT, str(report)) for k, v in env.items()}
        added["XLAPIPE_MACHINE"] = node
        server_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        server_env.pop("OMP_NUM_THREADS", None)  # Ray's 1 for a task that asks for no CPU, not the run's
        with processes.ProcessServer(sys.executable, server_env, Path(tmp) / "server.log", cwd=cwd) as server:
            outcome = processes.run_one(server, here, limit, log, report, added)
        text = ""
        if log.exists():
            with open(log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL))
                text = f.read().decode(errors="replace")
    outcome["error"] = outcome.get("error", "").replace(str(report), "(the run's report)")
    return {"outcome": outcome, "log": text}
