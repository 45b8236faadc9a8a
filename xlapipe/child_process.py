"""The one way xlapipe's commands run a user's script: in a child process, watched, and cleaned up.

``xlapipe ablate`` (on this machine and on a Ray cluster's), ``xlapipe doctor``
and the benchmarks start every script through :func:`run`:

- the child gets the environment and working folder given, and a temporary
  folder of its own (``TMPDIR``), removed when it ends;
- its output goes to a log file, of which only the end is ever read back
  (:func:`tail`): a run that prints gigabytes costs no memory here;
- it is stopped at its time limit, when ``stop_when()`` says so, and when this
  process is interrupted (SIGINT, or SIGTERM inside :func:`interruptible`):
  then the child and every process it started are killed, and the temporary
  folder removed;
- its result channel is a JSON file it writes (``result``), read once it ended.

The child runs under a guard: this file run as a script (the standard library
only, so it imports nothing the child would not). The guard makes itself the
subreaper of everything the child starts (an orphaned grandchild comes back to
it), kills all of it when the child ends, when it is told to (SIGTERM), and when
the process that started it dies, even by SIGKILL (``PR_SET_PDEATHSIG``); it
writes the child's exit status down a pipe. Guard and child have a process group
of their own, so a signal to the group (the doctor's stack dump) reaches every
process of the run, and the terminal's Ctrl-C reaches only this process, which
then stops the run itself.

This module imports the standard library only: a Ray worker loads it from its
file without importing xlapipe (see :mod:`xlapipe.ablation.on_node`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUARD = os.path.abspath(__file__)
POLL_S = 0.05
STOP_WAIT_S = 30.0  # how long the guard has to kill the run's processes before its group gets SIGKILL
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


class Interrupted(KeyboardInterrupt):
    """This process was asked to stop by a signal (SIGINT or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` while inside (main thread only; handlers restored after).

    A :func:`run` in progress then stops its child and removes its folder on the way out.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: its own handlers stay in force
        return

    def stop(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    before = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def exit_text(code: int) -> str:
    """``exit code 3``, or ``killed by SIGSEGV (signal 11)`` for a negative return code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        return f"killed by {name} (signal {-code})"
    return f"exit code {code}"


def tail(path: str | os.PathLike, chars: int = 3000) -> str:
    """The last ``chars`` characters of the file at ``path`` (read from its end), or "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * chars))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


@dataclass(frozen=True)
class Outcome:
    """How a run ended.

    ``status``: ``ended`` (exit 0), ``failed`` (another exit code, or killed by
    a signal not ours), ``timeout`` (its limit passed), ``stopped``
    (``stop_when()`` said so). ``result``: the JSON object the run wrote to its
    result file, else None and ``result_error`` says why.
    """

    status: str
    returncode: int | None
    elapsed_s: float
    pid: int
    leftovers: int  # processes still running after the child's own process ended (killed)
    log: Path
    result: dict[str, Any] | None = None
    result_error: str = ""

    def tail(self, chars: int = 3000) -> str:
        return tail(self.log, chars)


def run(
    argv: Sequence[str],
    *,
    log: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    limit: float | None = None,
    result: str | os.PathLike | None = None,
    stop_when: Callable[[], bool] | None = None,
    on_timeout: Callable[[int], None] | None = None,
    orphaned: Sequence[str | os.PathLike] = (),
) -> Outcome:
    """Run ``argv`` (see the module's docstring) until it ends, ``limit`` seconds pass, or ``stop_when()``.

    ``env`` is the child's whole environment (default: this process's);
    ``on_timeout(group)`` is called with the run's process group before a run
    that timed out is killed (the doctor asks it for its stacks). ``orphaned``:
    folders of this process's that the guard removes if this process dies
    before the run ends (its ``TMPDIR`` always): nothing is left on disk,
    even after a SIGKILL.
    """
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    if result is not None:
        Path(result).unlink(missing_ok=True)
    tmp = tempfile.mkdtemp(prefix="xlapipe-run-")
    child_env = {**(os.environ if env is None else env), "TMPDIR": tmp}
    read_end, write_end = os.pipe()
    status = ""
    begin = time.monotonic()
    try:
        with open(log, "wb") as out:
            guard = subprocess.Popen(
                [sys.executable, GUARD, str(write_end), str(os.getpid()), _folders(tmp, orphaned), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                pass_fds=[write_end],
                start_new_session=True,  # the run's own process group (see the module's docstring)
            )
        os.close(write_end)
        write_end = -1
        try:
            while guard.poll() is None:
                if stop_when is not None and stop_when():
                    status = "stopped"
                elif limit is not None and time.monotonic() - begin > limit:
                    status = "timeout"
                if status == "timeout" and on_timeout is not None:
                    on_timeout(guard.pid)
                if status:
                    break
                time.sleep(POLL_S)
        finally:
            _stop(guard)
        ended = _read_status(read_end)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
    code = ended.get("returncode")
    if not status:
        status = "ended" if code == 0 else "failed"
    found, why = _read_result(result) if result is not None else (None, "")
    return Outcome(
        status=status,
        returncode=None if status in ("timeout", "stopped") else code,
        elapsed_s=float(ended.get("elapsed_s", time.monotonic() - begin)),
        pid=int(ended.get("pid", -1)),
        leftovers=int(ended.get("leftovers", 0)),
        log=log,
        result=found,
        result_error=why,
    )


def _folders(tmp: str, orphaned: Sequence[str | os.PathLike]) -> str:
    """The folders the guard removes if its starter dies (JSON, one argument)."""
    return json.dumps([tmp, *(os.path.abspath(p) for p in orphaned)])


def _stop(guard: subprocess.Popen) -> None:
    """Have the guard kill the run's processes (they may be gone already); its group gets SIGKILL if it cannot."""
    if guard.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            guard.terminate()
        try:
            guard.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(guard.pid, signal.SIGKILL)  # anything left in the run's group (the guard's own included)
    guard.wait()


def _read_status(fd: int) -> dict[str, Any]:
    """What the guard wrote down the pipe (empty when it was killed before it could)."""
    chunks = []
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    try:
        status: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}
    return status


def _read_result(path: str | os.PathLike) -> tuple[dict[str, Any] | None, str]:
    """The JSON object at ``path``, or None and why not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        return None, str(error)
    if not isinstance(data, dict):
        return None, f"the result is a {type(data).__name__}, not a JSON object"
    return data, ""


# -- the guard: this file run as a script ----------------------------------------------------------
def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe and the process group still hold
        pass


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class _Guard:
    def __init__(self, status_fd: int, parent: int, folders: list[str]) -> None:
        self.status_fd, self.parent, self.folders = status_fd, parent, folders
        self.reaped: dict[int, int] = {}
        self.pid = -1
        self.start = time.perf_counter()

    def reap(self, block: bool) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped[pid] = wait_status
            if block:
                return

    def kill_all(self) -> int:
        """SIGKILL every process below this one until none is left; how many there were."""
        killed: set[int] = set()
        for _ in range(1000):
            pids = [p for p in _descendants(os.getpid()) if p not in self.reaped]
            if not pids:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            killed.update(pids)
            time.sleep(0.01)
            self.reap(block=False)
        return len(killed - {self.pid})

    def report(self, **status: Any) -> None:
        elapsed = time.perf_counter() - self.start
        with contextlib.suppress(OSError):
            os.write(self.status_fd, json.dumps({"pid": self.pid, "elapsed_s": elapsed, **status}).encode())

    def told_to_stop(self, *_: object) -> None:
        self.kill_all()
        if os.getppid() != self.parent:  # its starter died (PR_SET_PDEATHSIG): nobody else will clean up
            for folder in self.folders:
                shutil.rmtree(folder, ignore_errors=True)
        self.report(returncode=None, stopped=True)
        os._exit(0)

    def main(self, argv: list[str]) -> int:
        self.start = time.perf_counter()
        try:
            child = subprocess.Popen(argv)
        except OSError as error:
            print(f"cannot run {argv[0]}: {error}", file=sys.stderr, flush=True)
            self.report(returncode=127, leftovers=0)
            return 0
        self.pid = child.pid
        while self.pid not in self.reaped:
            self.reap(block=True)
        leftovers = self.kill_all()
        self.report(returncode=os.waitstatus_to_exitcode(self.reaped[self.pid]), leftovers=leftovers)
        return 0


def _guard_main(args: list[str]) -> int:
    status_fd, parent, folders, argv = int(args[0]), int(args[1]), json.loads(args[2]), args[3:]
    guard = _Guard(status_fd, parent, folders)
    signal.signal(signal.SIGTERM, guard.told_to_stop)
    for s in (signal.SIGINT, signal.SIGUSR1):  # meant for the run; a handler, not SIG_IGN, which exec keeps
        signal.signal(s, lambda *_: None)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the starter died before the line above: nobody will stop this run
        return 1
    return guard.main(argv)


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: nothing here may shadow the run's imports (none are made)
    sys.exit(_guard_main(sys.argv[1:]))
