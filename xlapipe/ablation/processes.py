"""The runner's side of its processes: the process server, one run's outcome, the lock, signals.

Every run goes through a process server (:mod:`xlapipe.ablation.forkserver`),
started once per ablation. In ``fork`` isolation the server first imports what
the workload imports (running it once with ``--print-pipeline``) without
starting torch_xla's runtime, then forks each run from that warm process: a
fresh XLA runtime per run, without paying for the interpreter and the imports
each time. In ``exec`` isolation each run is a fresh interpreter. Either way
the server kills a run's whole process tree on timeout, on request and when
the runner goes away, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SERVER_FILE = Path(__file__).with_name("forkserver.py")
LOCK_FILE = ".ablate.lock"
# Imported in the warm server before anything else (none of them starts the XLA runtime).
PRELOAD = (
    "torch",
    "torch_xla",
    "torch_xla.core.xla_model",
    "torch_xla.debug.metrics",
    "torch_xla.distributed.parallel_loader",
    "torch_xla.runtime",
    "xlapipe",
)


class Interrupted(KeyboardInterrupt):
    """The runner was asked to stop by a signal (SIGINT or SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_text(code: int) -> str:
    """``exit code 3``, or ``killed by SIGSEGV (signal 11)`` for a negative return code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        return f"killed by {name} (signal {-code})"
    return f"exit code {code}"


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Interrupted`, as Ctrl-C does, while inside (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class OutLock:
    """An exclusive lock on an output folder, held while an ablation writes there (released on exit or death)."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.path = Path(out) / LOCK_FILE
        self.fd: int | None = None

    def __enter__(self) -> OutLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RuntimeError(
                    f"{self.path.parent} is in use by another `xlapipe ablate` ({holder}); two runners "
                    "cannot write the same --out at once: wait for it to finish, or give another --out"
                ) from None
            raise
        os.ftruncate(fd, 0)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()}, started {started}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class ProcessServer:
    """A running :mod:`~xlapipe.ablation.forkserver`: warms up, then starts and watches each run."""

    def __init__(
        self, python: str, env: Mapping[str, str], log: str | os.PathLike, cwd: str | None = None
    ) -> None:
        ours, theirs = socket.socketpair()
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [python, str(SERVER_FILE), "--fd", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
            )
        theirs.close()
        self.sock = ours
        self.log = Path(log)
        self.buffer = b""
        self.warm_mode = False

    # -- messages ---------------------------------------------------------------------
    def _send(self, message: dict) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as error:
            raise RuntimeError(
                f"the ablation's process server has gone ({error}); its log: {self.log}"
            ) from None

    def _receive(self, timeout: float | None) -> dict | None:
        """The next message, or None when ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                tail = _tail(self.log, 2000)
                raise RuntimeError(
                    f"the ablation's process server exited; the end of its log ({self.log}):\n{tail}"
                )
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict = json.loads(line)
        return message

    # -- operations -------------------------------------------------------------------
    def warm(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        function: str | None = None,
    ) -> dict[str, Any]:
        """Import what the workload imports in the server (see the module's docstring)."""
        message = {"op": "warm", "argv": list(argv), "env": dict(env or {}), "function": function}
        self._send({**message, "preload": list(PRELOAD)})
        reply = self._receive(timeout)
        if reply is None:
            self.proc.terminate()  # the script is still running in the server: its SIGTERM handler ends it
            self.proc.wait()
            raise RuntimeError(
                f"running {' '.join(argv[1:2])} up to its pipeline did not finish in {timeout:g} s (the "
                "run's time limit); give a longer --timeout, or check that the script reaches xp.session"
            )
        self.warm_mode = not reply["started"]  # a script stopped before training leaves the server forkable
        return reply

    def run(
        self,
        argv: Sequence[str],
        log: str | os.PathLike,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run ``argv`` with ``env`` added (forked when warm, else a fresh interpreter); its pid, code, time."""
        message = {"op": "run", "argv": list(argv), "env": dict(env or {}), "log": str(log)}
        self._send({**message, "timeout": timeout, "fork": self.warm_mode})
        try:
            started = self._receive(60)
            if started is None:
                raise RuntimeError("the process server did not start the run within 60 s")
            while True:
                done = self._receive(timeout + 120)
                if done is None:
                    raise RuntimeError(f"the process server lost the run (pid {started['pid']})")
                if done.get("event") == "exited":
                    return done
        except BaseException:  # Ctrl-C, SIGTERM, a lost server: take the run down with us
            self.kill_run()
            raise

    def kill_run(self) -> None:
        """Kill the run in flight and wait (briefly) until the server confirms."""
        with contextlib.suppress(RuntimeError, OSError):
            self._send({"op": "kill"})
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                reply = self._receive(deadline - time.monotonic())
                if reply is None or reply.get("event") == "exited":
                    return

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._send({"op": "exit"})
        self.sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # its SIGTERM handler kills what is left of the runs
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ProcessServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def run_one(
    server: ProcessServer,
    cmd: Sequence[str],
    timeout: float,
    log: Path,
    report: Path,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` through ``server``: status ok/error/timeout, error text, report, time, pid.

    A run that times out is recorded with its limit (``limit_s``: it would have
    taken longer than that) and whatever report it wrote before it was killed.
    """
    report.unlink(missing_ok=True)
    done = server.run(cmd, log, timeout, env)
    code, elapsed, pid = done["returncode"], done["elapsed_s"], done["pid"]
    extra = {"leftovers_killed": done["leftovers"]} if done.get("leftovers") else {}
    base = {"pid": pid, "elapsed_s": elapsed, **extra}
    data, unreadable = _report(report)
    if done.get("reason") == "timeout":
        return {
            **base,
            "status": "timeout",
            "returncode": None,
            "report": data,
            "limit_s": timeout,
            "error": f"timed out after {timeout:g} s; last output:\n{_tail(log)}",
        }
    if code != 0:
        return {
            **base,
            "status": "error",
            "returncode": code,
            "report": None,
            "error": f"{exit_text(code)}; last output:\n{_tail(log)}",
        }
    if data is None:
        return {
            **base,
            "status": "error",
            "returncode": code,
            "report": None,
            "error": f"exited 0 but wrote no readable report to {report} ({unreadable}); "
            "a workload must honour --report PATH, and a script run unchanged must train in xp.session",
        }
    return {**base, "status": "ok", "returncode": 0, "report": data, "error": ""}


def _report(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The JSON object at ``path``, or None and why not."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return None, str(error)
    if not isinstance(data, dict):
        return None, f"the report is a {type(data).__name__}, not a JSON object"
    return data, ""
