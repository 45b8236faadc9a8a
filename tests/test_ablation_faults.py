"""Faults around the ablation runner: signals, a killed runner, two runners, bad input, reused folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import alive
from xlapipe.ablation import Judging, Output, Results, Runs, Variants, ablate
from xlapipe.ablation import results as store
from xlapipe.ablation.lock import OutLock
from xlapipe.child_process import exit_text
from xlapipe.cli import main

WORKLOADS = Path(__file__).parent / "workloads"
SCRIPT = str(WORKLOADS / "tiny_mlp.py")
FAULTY = f"{WORKLOADS / 'faulty.py'}:train"
SYNTHETIC = f"{WORKLOADS / 'synthetic.py'}:train"
ROOT = Path(__file__).resolve().parent.parent


def _once(target: str, variants: list, kwargs: dict, out: Path, **runs) -> Results:
    """One round of explicit ``variants`` of a function target, quietly."""
    return ablate(
        target,
        kwargs,
        variants=Variants(mode="explicit", explicit=variants),
        judging=Judging(repeats=1, until_resolved=False),
        runs=Runs(**runs),
        output=Output(out, progress=False, echo=None),
    )


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            out.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return out


def _descendants(pid: int) -> set[int]:
    children, found, todo = _children(), set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            found.add(c)
            todo.append(c)
    return found


def _start_hanging_runner(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`xlapipe ablate` in a subprocess, with its second variant hanging (with a child of its own)."""
    out = tmp_path / "abl"
    variants = json.dumps(
        [{"name": "fine", "pipeline": []}, {"name": "hangs", "pipeline": [{"name": "with_device"}]}]
    )
    kwargs = json.dumps({"hang_if": "with_device", "max_steps": 2, "warmup": 1})
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xlapipe.cli",
            "ablate",
            FAULTY,
            "--mode",
            "explicit",
            "--variants",
            variants,
            "--kwargs",
            kwargs,
            "--out",
            str(out),
            "--timeout",
            "600",
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 240
    logs = out / "runs"
    while time.monotonic() < deadline:
        hanging = [p for p in logs.glob("*/01-hangs.r1.log") if "hanging" in p.read_text(errors="replace")]
        if hanging:
            return proc, out
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the hanging variant never started")


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = {p for p in pids if alive(p)}
        if not left:
            return set()
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def test_sigterm_kills_the_run_in_flight_and_records_nothing_for_it(tmp_path):
    proc, out = _start_hanging_runner(tmp_path)
    family = _descendants(proc.pid)
    assert len(family) >= 3  # the run's guard, the hanging run, the run's own child
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert _gone_within(family, 10) == set()
    records = store.load(out / store.RESULTS_FILE)
    # nothing for the run in flight ("fine" ran before it, or not yet: each round in its random order)
    assert [r["variant"] for r in records] in (["fine"], [])


def test_no_run_outlives_a_runner_killed_with_sigkill(tmp_path):
    proc, out = _start_hanging_runner(tmp_path)
    family = _descendants(proc.pid)
    assert len(family) >= 3
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone_within(family, 15) == set(), "a run outlived its runner"
    # the lock went with the runner: the folder can be used again at once
    with OutLock(out):
        pass


def test_two_runners_cannot_write_the_same_out(tmp_path, capsys):
    with OutLock(tmp_path):
        with pytest.raises(RuntimeError, match="in use by another `xlapipe ablate` \\(pid"):
            _once(SYNTHETIC, [[]], {"times": {"": 1.0}}, tmp_path)
        code = main(
            [
                "ablate",
                SYNTHETIC,
                "--mode",
                "explicit",
                "--variants",
                "[[]]",
                "--kwargs",
                '{"times": {"": 1}}',
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        assert code == 2 and "cannot write the same --out at once" in capsys.readouterr().err
    assert not (tmp_path / store.RESULTS_FILE).exists()


def test_a_run_killed_by_a_signal_is_recorded_with_its_name(tmp_path):
    variants = [{"name": "fine", "pipeline": []}, {"name": "crashes", "pipeline": [{"name": "with_device"}]}]
    kwargs = {"crash_if": "with_device", "max_steps": 2, "warmup": 1}
    res = _once(FAULTY, variants, kwargs, tmp_path, timeout=300)
    crashed = next(r for r in store.load(tmp_path / store.RESULTS_FILE) if r["variant"] == "crashes")
    assert crashed["status"] == "error" and crashed["returncode"] == -signal.SIGSEGV
    assert crashed["error"].startswith("killed by SIGSEGV (signal 11)")
    assert "exit code -11" not in crashed["error"]
    assert "killed by SIGSEGV" in (tmp_path / "ablation.md").read_text()
    assert res["crashes"].runs == "0/1 ok, 1 error"
    assert exit_text(-9) == "killed by SIGKILL (signal 9)" and exit_text(3) == "exit code 3"


def test_reusing_an_out_with_other_arguments_keeps_every_log(tmp_path):
    for sleep in (0.0, 0.01):  # other function arguments: another configuration
        _once(SYNTHETIC, [[]], {"times": {"": 1.0}, "sleep": sleep}, tmp_path)
    _once(SYNTHETIC, [[]], {"times": {"": 1.0}, "sleep": 0.0}, tmp_path)  # resumed: nothing run again
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert len(records) == 2
    logs = [Path(r["log"]) for r in records]
    assert len(set(logs)) == 2 and all(p.exists() for p in logs)
    assert logs[0].parent != logs[1].parent  # one folder per configuration


def test_a_retried_run_gets_its_own_log(tmp_path):
    kwargs = {"fail_if": "with_device", "max_steps": 2, "warmup": 1}
    variants = [[{"name": "with_device"}]]
    for _ in range(2):
        _once(FAULTY, variants, kwargs, tmp_path)
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["error", "error"]
    first, second = (Path(r["log"]) for r in records)
    assert first != second and second.name.endswith(".a2.log")
    assert "deliberate failure" in first.read_text()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1, "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be a"):
        Runs(timeout=timeout)


def test_the_time_limit_covers_running_the_script_up_to_its_pipeline(tmp_path):
    script = tmp_path / "slow_start.py"
    script.write_text("import time\ntime.sleep(600)\n")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish in 3 s"):
        ablate(str(script), runs=Runs(timeout=3), output=Output(tmp_path / "o", progress=False, echo=None))
    assert time.monotonic() - start < 60


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-3", "soon"])
def test_cli_refuses_a_bad_timeout(value, capsys, tmp_path):
    code, err = _cli(["ablate", SCRIPT, "--timeout", value, "--out", str(tmp_path)], capsys)
    assert code == 2 and "error:" in err and "--timeout" in err and "Traceback" not in err


def test_cli_bad_json_and_files_give_an_error_line_and_exit_2(tmp_path, capsys):
    bad_file = tmp_path / "bad.json"
    bad_file.write_text("[{not json")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    explicit = ["ablate", SCRIPT, "--mode", "explicit", "--out", str(tmp_path / "o")]
    function = ["ablate", SYNTHETIC, "--mode", "explicit", "--variants", "[[]]", "--out", str(tmp_path / "o")]
    cases = [
        ([*explicit, "--variants", "{bad"], "--variants is not valid JSON"),
        ([*explicit, "--variants", str(bad_file)], f"--variants (file {bad_file}) is not valid JSON"),
        ([*explicit, "--variants", str(tmp_path)], "is a folder"),
        ([*explicit, "--variants", "no_such_file.json"], "there is no file 'no_such_file.json'"),
        ([*explicit, "--variants", '{"name": "x"}'], "explicit variants are a list"),
        ([*explicit, "--variants", "[1]"], "explicit variant 0 must be a pipeline description"),
        ([*explicit, "--variants", '[[{"nme": "with_device"}]]'], 'needs a "name"'),
        (
            [*explicit, "--variants", '[[{"name": "with_device", "params": null}]]'],
            '"params" must be an object',
        ),
        (
            [*explicit, "--variants", '[[{"name": "no_such_practice"}]]'],
            "unknown transform 'no_such_practice'",
        ),
        ([*function, "--kwargs", "[1, 2]"], "--kwargs must be a JSON object"),
        ([*function, "--kwargs", "{oops"], "--kwargs is not valid JSON"),
        ([*function, "--kwargs", str(bad_file)], "is not valid JSON"),
        (
            ["ablate", SCRIPT, "--pipeline", '{"name": "with_device"}', "--out", str(tmp_path / "o")],
            "--pipeline must be a JSON list",
        ),
        (["ablate", SCRIPT, "--pipeline", "[]", "--out", str(a_file)], "is a file; give a folder"),
        (["ablate", SCRIPT, "--pipeline", "[]", "--out", str(a_file / "sub")], "which is a file"),
        ([*function, "--kwargs", '{"times": {}}', "--budget", "soon"], "a duration is seconds"),
        ([*function, "--kwargs", '{"times": {}}', "--target-metric", "high"], "a target metric is a number"),
        (
            [*function, "--kwargs", '{"times": {}}', "--confidence", "95"],
            "confidence must be between 0 and 1",
        ),
        (
            [*function, "--kwargs", '{"times": {}}', "--ray", "auto", "--ray-resources", "TPU"],
            "is a JSON object",
        ),
        (
            [*function, "--kwargs", '{"times": {}}', "--ray", "auto", "--ray-resources", '{"TPU": 0}'],
            "positive",
        ),
        ([*function, "--kwargs", '{"times": {}}', "--ray", "nohost"], "or the head node's HOST:PORT"),
        ([*function, "--kwargs", '{"times": {}}', "--resume", "--out", str(tmp_path / "none")], "has no"),
    ]
    for argv, message in cases:
        code, err = _cli(argv, capsys)
        assert code == 2, (argv, err)
        assert message in err and "error:" in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "o" / store.RESULTS_FILE).exists()
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):  # "x" is no record
        code, err = _cli(["report", str(a_file)], capsys)
    assert code == 2 and "holds no results" in err and "Traceback" not in err, err
