"""The one runner (xlapipe.child_process): how a run ends, its result, its output, and nothing left behind.

Plain Python children (no torch): each test takes a second or two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import alive
from xlapipe import child_process
from xlapipe.child_process import Interrupted, interruptible, run

ROOT = Path(__file__).resolve().parents[1]


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _pids(path: Path, n: int, seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            pids = [int(p) for p in path.read_text().split()]
            if len(pids) >= n:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"the run never wrote {n} pids to {path}")


# A run that starts a child of its own, and a grandchild that leaves the process group (setsid),
# writes their pids, then sleeps (or ends, with END set).
SPAWNER = """
    import os, subprocess, sys, time
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    escaped = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    with open(os.environ["PIDS"], "w") as f:
        f.write(f"{os.getpid()} {kid.pid} {escaped.pid}")
    if not os.environ.get("END"):
        time.sleep(600)
"""


def test_a_run_that_ends_gives_its_result_and_exit_status(tmp_path):
    argv = _script(
        tmp_path,
        """
        import json, os, sys
        json.dump({"loss": 0.5, "argv": sys.argv[1:]}, open(os.environ["RESULT"], "w"))
        print("hello from the run")
        """,
    )
    result = tmp_path / "r.json"
    done = run(
        [*argv, "a", "b"], log=tmp_path / "log", env={**os.environ, "RESULT": str(result)}, result=result
    )
    assert done.status == "ended" and done.returncode == 0
    assert done.result == {"loss": 0.5, "argv": ["a", "b"]}
    assert "hello from the run" in done.tail()
    assert done.pid > 0 and done.pid != os.getpid() and done.leftovers == 0


def test_a_failed_run_has_its_code_or_its_signal_and_no_result(tmp_path):
    stale = tmp_path / "r.json"
    stale.write_text('{"loss": 0.1}')  # an earlier run's: never this one's
    code = run(_script(tmp_path, "raise SystemExit(3)"), log=tmp_path / "a", result=stale)
    assert code.status == "failed" and code.returncode == 3
    assert code.result is None and "No such file" in code.result_error
    crash = run(
        _script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), log=tmp_path / "b"
    )
    assert crash.status == "failed" and crash.returncode == -signal.SIGSEGV
    assert child_process.exit_text(crash.returncode) == "killed by SIGSEGV (signal 11)"
    missing = run(["/no/such/interpreter"], log=tmp_path / "c")
    assert missing.status == "failed" and missing.returncode == 127
    assert "cannot run /no/such/interpreter" in missing.tail()


def test_a_result_that_is_not_an_object_is_refused(tmp_path):
    argv = _script(tmp_path, "import os; open(os.environ['RESULT'], 'w').write('[1, 2]')")
    result = tmp_path / "r.json"
    done = run(argv, log=tmp_path / "log", env={**os.environ, "RESULT": str(result)}, result=result)
    assert done.status == "ended" and done.result is None
    assert done.result_error == "the result is a list, not a JSON object"


def test_the_time_limit_kills_the_run_and_everything_it_started(tmp_path):
    pids = tmp_path / "pids"
    asked: list[int] = []
    start = time.monotonic()
    done = run(
        _script(tmp_path, SPAWNER),
        log=tmp_path / "log",
        env={**os.environ, "PIDS": str(pids)},
        limit=3,
        on_timeout=asked.append,
    )
    assert done.status == "timeout" and done.returncode is None
    assert 3 <= time.monotonic() - start < 60
    assert len(asked) == 1  # the run's process group, given to on_timeout before the kill
    assert not any(alive(p) for p in _pids(pids, 3))  # the grandchild outside its group too


def test_processes_left_by_a_run_that_ended_are_killed_and_counted(tmp_path):
    pids = tmp_path / "pids"
    done = run(
        _script(tmp_path, SPAWNER), log=tmp_path / "log", env={**os.environ, "PIDS": str(pids), "END": "1"}
    )
    assert done.status == "ended" and done.leftovers == 2
    assert not any(alive(p) for p in _pids(pids, 3))


def test_stop_when_stops_the_run(tmp_path):
    flag = tmp_path / "flag"
    argv = _script(tmp_path, f"import time, pathlib; pathlib.Path({str(flag)!r}).touch(); time.sleep(600)")
    done = run(argv, log=tmp_path / "log", limit=120, stop_when=flag.exists)
    assert done.status == "stopped" and done.returncode is None and done.elapsed_s < 60


def test_the_run_gets_a_temporary_folder_of_its_own_removed_after(tmp_path):
    argv = _script(
        tmp_path,
        """
        import json, os, tempfile
        held = tempfile.mkdtemp()  # never removed by the run itself
        json.dump({"tmp": os.environ["TMPDIR"], "held": held}, open(os.environ["RESULT"], "w"))
        """,
    )
    result = tmp_path / "r.json"
    done = run(argv, log=tmp_path / "log", env={**os.environ, "RESULT": str(result)}, result=result)
    assert done.result is not None
    assert done.result["held"].startswith(done.result["tmp"])
    assert not os.path.exists(done.result["tmp"])


def test_only_the_end_of_a_long_output_is_read(tmp_path):
    argv = _script(
        tmp_path,
        """
        import sys
        for i in range(200_000):
            sys.stdout.write(f"line {i} " + "x" * 90 + "\\n")
        print("the last line")
        """,
    )
    done = run(argv, log=tmp_path / "log")
    assert os.path.getsize(done.log) > 20_000_000
    end = done.tail(500)
    assert len(end) == 500 and end.endswith("the last line\n")


def test_a_log_holds_one_run(tmp_path):
    log = tmp_path / "log"
    run(_script(tmp_path, "print('first')"), log=log)
    run(_script(tmp_path, "print('second')"), log=log)
    assert log.read_text() == "second\n"


DRIVER = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from xlapipe.child_process import interruptible, run
os.makedirs({held!r})
try:
    with interruptible():
        env = {{**os.environ, "PIDS": {pids!r}}}
        run([sys.executable, {script!r}], log={log!r}, env=env, orphaned=[{held!r}])
except KeyboardInterrupt as stop:
    print("interrupted", getattr(stop, "signum", None), flush=True)
    sys.exit(5)
"""


def _driver(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent(SPAWNER))
    pids = tmp_path / "pids"
    code = DRIVER.format(
        root=str(ROOT),
        script=str(script),
        log=str(tmp_path / "log"),
        pids=str(pids),
        held=str(tmp_path / "held"),
    )
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    return proc, pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_starter_stops_the_run_and_removes_its_folder(tmp_path, signum):
    proc, pids = _driver(tmp_path)
    family = _pids(pids, 3)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 5 and out.split() == ["interrupted", str(int(signum))]
    assert not any(alive(p) for p in family)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert (tmp_path / "held").is_dir()  # the starter's folder: the guard removes it only if it dies


def test_nothing_outlives_a_starter_killed_with_sigkill_no_process_no_folder(tmp_path):
    proc, pids = _driver(tmp_path)
    family = _pids(pids, 3)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in family)
    # nothing left on disk either: the run's TMPDIR and the folder the starter named (the doctor's)
    while (tmp_path / "held").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (tmp_path / "held").exists()
    # (the starter's own temporary files, torch's from its import, died with it: not the runner's)
    assert list((tmp_path / "tmp").glob("xlapipe-run-*")) == []


def test_interruptible_restores_the_handlers_before_it(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as caught:
        with interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert caught.value.signum == signal.SIGTERM
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_doctor_loads_no_module_of_the_ablation(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('not a torch_xla script')\n")
    code = (
        "import sys\n"
        "from xlapipe.cli import main\n"
        f"main(['doctor', {str(script)!r}, '--steps', '4', '--timeout', '120'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('xlapipe.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    loaded = json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert "xlapipe.child_process" in loaded and "xlapipe.doctor.diagnose" in loaded  # it ran the script
    assert [m for m in loaded if m.startswith("xlapipe.ablation")] == []
