"""Running the user's script in a fresh process under the probe, stopping it after N steps or a timeout."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from attrs import define, field

from xlapipe.doctor import probe

PROBE_FILE = probe.__file__
HARNESS = "xlapipe.doctor.harness:observe"
OUTPUT = "output.txt"
TMP = "tmp"
_LIMIT = '"kind": "limit"'
_POLL_S = 0.1
_STACKS_WAIT_S = 1.0


class Stopped(KeyboardInterrupt):
    """The doctor was asked to stop (SIGINT or SIGTERM): the script's process group is killed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Stopped` in the doctor meanwhile (so its ``finally`` blocks kill
    the script and remove the run's folder); the handlers before are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: its own handlers stay in force
        return

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@define
class Outcome:
    """How the script's process ended."""

    status: str  # "steps" (N steps reached, then stopped), "ended" (exit 0), "failed", "timeout"
    returncode: int | None
    elapsed_s: float
    folder: str

    @property
    def output(self) -> str:
        return os.path.join(self.folder, OUTPUT)


@define
class _Scanner:
    """Reads what the trace files gained since last time, looking for the probe's 'limit' record."""

    folder: str
    offsets: dict[str, int] = field(factory=dict)

    def limit_reached(self) -> bool:
        for path in glob.glob(os.path.join(self.folder, probe.TRACE.format(pid="*"))):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # complete lines only
            self.offsets[path] = self.offsets.get(path, 0) + end
            if _LIMIT.encode() in chunk[:end]:
                return True
        return False


def environment(folder: str, steps: int, mode: str) -> dict[str, str]:
    """The script's environment: the user's, the runtime chosen as xlapipe would, the probe's switches."""
    from xlapipe import runtime

    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", runtime.default_pjrt_device())
    # the script's temporary files (torch makes one at import) go with the run's folder: a script
    # stopped with SIGKILL never removes its own
    env["TMPDIR"] = os.path.join(folder, TMP)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    env.update(
        {probe.DIR_ENV: folder, probe.STEPS_ENV: str(steps), probe.MODE_ENV: mode, "PYTHONUNBUFFERED": "1"}
    )
    if mode == "diagnose":
        env["XLAPIPE_HARNESS"] = HARNESS
    return env


def run(
    script: str,
    args: Sequence[str],
    *,
    folder: str,
    steps: int,
    timeout: float,
    python: str,
    mode: str = "diagnose",
) -> Outcome:
    """Run ``python SCRIPT ARGS`` under the probe until N steps, its end, or ``timeout`` seconds."""
    begin = time.monotonic()
    scanner = _Scanner(folder)
    with open(os.path.join(folder, OUTPUT), "wb") as output:
        process = subprocess.Popen(
            [python, "-c", probe.BOOT, PROBE_FILE, script, *args],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment(folder, steps, mode),
            start_new_session=True,  # its own process group: stopped whole, forked replicas included
        )
    try:
        while True:
            code = process.poll()
            if scanner.limit_reached():
                status = "steps"
                break
            if code is not None:
                status = "ended" if code == 0 else "failed"
                break
            if time.monotonic() - begin > timeout:
                _signal(process, signal.SIGUSR1)  # every thread's stack to the stacks files
                time.sleep(_STACKS_WAIT_S)
                status = "timeout"
                break
            time.sleep(_POLL_S)
    finally:
        _signal(process, signal.SIGKILL)
        process.wait()
    return Outcome(status, process.returncode, time.monotonic() - begin, folder)


def _signal(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
