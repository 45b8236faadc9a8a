"""Running the user's script in a fresh process under the probe, stopping it after N steps or a timeout."""

from __future__ import annotations

import glob
import os
import signal
import time
from collections.abc import Sequence

from attrs import define, field

from xlapipe import child_process
from xlapipe.doctor import probe

PROBE_FILE = probe.__file__
HARNESS = "xlapipe.doctor.harness:observe"
OUTPUT = "output.txt"
_LIMIT = '"kind": "limit"'
_STACKS_WAIT_S = 1.0


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
    """Run ``python SCRIPT ARGS`` under the probe until N steps, its end, or ``timeout`` seconds.

    Through :func:`xlapipe.child_process.run`: the script and every process it
    started are stopped, and its temporary files removed, however it ends.
    """
    done = child_process.run(
        [python, "-c", probe.BOOT, PROBE_FILE, script, *args],
        log=os.path.join(folder, OUTPUT),
        env=environment(folder, steps, mode),
        limit=timeout,
        stop_when=_Scanner(folder).limit_reached,
        on_timeout=_ask_for_stacks,
        orphaned=[folder],  # the doctor killed with SIGKILL leaves no folder behind either
    )
    status = "steps" if done.status == "stopped" else done.status
    return Outcome(status, done.returncode, done.elapsed_s, folder)


def _ask_for_stacks(group: int) -> None:
    """Every thread's stack of every process of the script to the stacks files (the probe's SIGUSR1)."""
    try:
        os.killpg(group, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        return
    time.sleep(_STACKS_WAIT_S)
