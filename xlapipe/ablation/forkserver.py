"""The ablation's process server: starts each run, times it out, and never lets one outlive the runner.

Run by the runner as ``python .../forkserver.py --fd N`` (by path, standard
library only, so that nothing is imported that a run would not import), it
talks JSON lines over the socket ``N``:

- ``{"op": "warm", "argv": [python, SCRIPT, *args], "env": {...}, "preload": [...], "function": SPEC}``:
  import what a run imports, by running the script once in this process (the
  runner's arguments and environment make it stop before it trains: it
  prints its pipeline, or the harness stops it at its first session), or
  (``function``) importing the function target's module; reply with what it
  printed and whether torch_xla's runtime started (then forking runs from here
  is impossible: torch_xla refuses to fork after its runtime started).
- ``{"op": "run", "argv": [...], "env": {...}, "log": PATH, "timeout": S, "fork": bool}``:
  start the run, with ``env`` added to its environment (forked from this warm
  process, which has imported everything but never started the XLA runtime;
  or a fresh interpreter, ``exec``), reply ``started`` with its pid, then
  ``exited`` with its wait status.
- ``{"op": "kill"}``: kill the run in flight (its whole process tree).

Every run's process tree is killed when it times out, when asked, when the
run's own process exits and leaves children behind, and when the runner goes
away: this server is a child subreaper (orphaned descendants of a run come
back to it), it gets SIGTERM when the runner dies (``PR_SET_PDEATHSIG``) and
sees the socket close, and each run's first process gets SIGKILL if this
server dies. Runs stay in the runner's process group, so a signal to that
group reaches all of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
import traceback
from typing import NoReturn

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the socket's end still stops us
        pass


def _ppids() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from /proc)."""
    children = _ppids()
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


class Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid = os.getpid()
        self.buffer = b""
        self.reaped: dict[int, int] = {}

    # -- messages ---------------------------------------------------------------------
    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float | None) -> dict | None:
        """The next message; {} when ``timeout`` passed; None when the runner has gone."""
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return {}
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict = json.loads(line)
        return message

    # -- processes --------------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped[pid] = status

    def kill_tree(self) -> int:
        """SIGKILL every descendant until none is left; how many were killed."""
        killed: set[int] = set()
        for _ in range(500):
            pids = [p for p in descendants(self.pid) if p not in self.reaped]
            if not pids:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
                killed.add(p)
            time.sleep(0.01)
            self.reap()
        return len(killed)

    def shutdown(self, *_: object) -> NoReturn:
        self.kill_tree()
        os._exit(0)

    # -- ops --------------------------------------------------------------------------
    def warm(self, message: dict) -> dict:
        printed = io.StringIO()
        code = 0
        error = ""
        argv = list(message["argv"])
        saved = dict(os.environ)
        os.environ.update(message.get("env") or {})
        try:
            for name in message.get("preload", ()):
                with contextlib.suppress(ImportError):
                    __import__(name)
            if message.get("function"):  # a function target: import its module (it may register transforms)
                __import__("xlapipe.ablation.worker", fromlist=["load_function"]).load_function(
                    message["function"]
                )
            else:
                with contextlib.redirect_stdout(printed):
                    code = _run_command(argv)
        except BaseException:  # noqa: BLE001  (reported to the runner, which decides)
            code, error = 1, traceback.format_exc()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        started = _runtime_started()
        return {
            "event": "warm",
            "code": code,
            "stdout": printed.getvalue(),
            "error": error[-4000:],
            "started": started,
        }

    def run(self, message: dict) -> dict | None:
        """Start a run and watch it; in the forked child, return the message to run it."""
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            return message
        self.send({"event": "started", "pid": pid})
        deadline = start + float(message["timeout"])
        reason = ""
        while pid not in self.reaped:
            request = self.receive(POLL_S)
            if request is None:  # the runner has gone: take everything down
                self.shutdown()
            if request.get("op") == "kill" and not reason:
                reason = "killed"
                self.kill_tree()
            self.reap()
            if not reason and time.perf_counter() > deadline and pid not in self.reaped:
                reason = "timeout"
                self.kill_tree()
        elapsed = time.perf_counter() - start
        status = self.reaped.pop(pid)
        leftovers = self.kill_tree()
        self.reaped.clear()
        code = os.waitstatus_to_exitcode(status)
        self.send(
            {
                "event": "exited",
                "pid": pid,
                "returncode": code,
                "reason": reason,
                "elapsed_s": elapsed,
                "leftovers": leftovers,
            }
        )
        return None

    def serve(self) -> dict | None:
        while True:
            message = self.receive(None)
            if message is None or message.get("op") == "exit":
                self.kill_tree()
                return None
            if message.get("op") == "warm":
                self.send(self.warm(message))
            elif message.get("op") == "run":
                job = self.run(message)
                if job is not None:
                    return job
            elif message.get("op") == "kill":
                self.kill_tree()


def _runtime_started() -> bool:
    xla = sys.modules.get("torch_xla")
    if xla is None:
        return False
    try:
        return bool(xla._XLAC._xla_runtime_is_initialized())
    except AttributeError:
        return False


def _run_command(argv: list[str]) -> int:
    """Run ``python SCRIPT ...`` or ``python -m MODULE ...`` in this process, as the interpreter would."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0]
    try:
        if argv[1:2] == ["-m"]:
            sys.argv = [argv[2], *argv[3:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[1])
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[0] = saved_path0
    return 0


def run_job(job: dict, server_pid: int) -> int:
    """In the forked child: become the run (exec a fresh interpreter, or run the command here)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:
        os._exit(1)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(job.get("env") or {})
    argv = list(job["argv"])
    if not job.get("fork"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as error:
            print(f"cannot run {argv[0]}: {error}", file=sys.stderr, flush=True)
            os._exit(127)
    try:
        return _run_command(argv)
    except BaseException:  # noqa: BLE001  (as the interpreter would: traceback, exit 1)
        traceback.print_exc()
        return 1


def main(argv: list[str]) -> dict | None:
    if argv[:1] != ["--fd"] or len(argv) != 2:
        print("usage: forkserver.py --fd N (started by xlapipe ablate)", file=sys.stderr)
        sys.exit(2)
    sys.path[0] = os.getcwd()  # not this file's folder: its modules must not shadow a run's imports
    runner = os.getppid()
    server = Server(socket.socket(fileno=int(argv[1])))
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, server.shutdown)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    if os.getppid() != runner:
        server.shutdown()
    job = server.serve()
    if job is None:
        return None
    server.sock.close()
    job["_server"] = server.pid
    return job


if __name__ == "__main__":
    _job = main(sys.argv[1:])
    if _job is not None:  # the forked child of a run: finish as the interpreter would
        sys.exit(run_job(_job, _job.pop("_server")))
