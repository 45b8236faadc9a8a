"""tools/mutate.py on a tiny repository: outcomes told apart, stale mutants reported, the checkout untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import mutate  # noqa: E402
from mutate import Mutant  # noqa: E402

CALC = """\
def add(a, b):
    return a + b


def double(x):
    return x * 2


def wait(x):
    return x
"""

TESTS = """\
from pkg.calc import add, double, wait


def test_add():
    assert add(2, 3) == 5


def test_double_runs():
    double(4)  # asserts nothing about the value: a mutant of double survives


def test_wait():
    assert wait(1) == 1
"""


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A git repository whose working tree differs from its last commit, as a checkout being worked on."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(CALC.replace("return a + b", "return b + a"))  # committed version
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / ".gitignore").write_text("ignored/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    (root / "pkg" / "calc.py").write_text(CALC)  # an uncommitted change the mutants are written against
    (root / "tests" / "test_new.py").write_text("def test_new():\n    pass\n")  # a new file, not yet added
    (root / "ignored").mkdir()
    (root / "ignored" / "big.bin").write_text("not copied")
    return root


def files_of(root) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


KILLED = Mutant(
    "add-subtracts", "pkg/calc.py", "return a + b", "return a - b", "add subtracts", ("tests/test_calc.py",)
)
SURVIVES = Mutant(
    "double-triples", "pkg/calc.py", "return x * 2", "return x * 3", "double triples", ("tests/test_calc.py",)
)
HANGS = Mutant(
    "wait-hangs",
    "pkg/calc.py",
    "    return x\n",
    "    import os, time\n    open(os.environ['PID_FILE'], 'w').write(str(os.getpid()))\n"
    "    time.sleep(300)\n",
    "wait never returns",
    ("tests/test_calc.py::test_wait",),
)


def run(repo, tmp_path, mutants, *argv: str) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    lines: list[str] = []
    code = mutate.main(["--out", str(out), *argv], mutants=mutants, repo=str(repo), echo=lines.append)
    report = json.loads((out / "mutation.json").read_text()) if (out / "mutation.json").exists() else {}
    return code, report, "\n".join(lines)


def test_killed_and_survived_mutants_are_told_apart_and_the_checkout_is_untouched(repo, tmp_path):
    before = files_of(repo)
    status = git(repo, "status", "--porcelain")
    code, report, echoed = run(repo, tmp_path, [KILLED, SURVIVES], "--jobs", "2")
    assert code == 0, echoed
    outcomes = {r["id"]: (r["outcome"], r["killed_by"]) for r in report["results"]}
    # the mutant is written against the working tree's calc.py, not the committed one
    assert outcomes == {
        "add-subtracts": ("killed", "tests/test_calc.py::test_add"),
        "double-triples": ("survived", ""),
    }
    assert report["score"]["score"] == "1/2" and report["baseline"].startswith("passed")
    table = (tmp_path / "out" / "mutation.md").read_text()
    assert "| add-subtracts | pkg/calc.py | add subtracts | killed | tests/test_calc.py::test_add |" in table
    assert "| double-triples | pkg/calc.py | double triples | **survived** |  |" in table
    assert "Score: **1/2 killed**" in table
    assert files_of(repo) == before and git(repo, "status", "--porcelain") == status


def test_the_copy_holds_tracked_and_new_files_as_they_are_in_the_working_tree(repo, tmp_path):
    (repo / "tests" / "gone.py").write_text("")
    git(repo, "add", "tests/gone.py")
    (repo / "tests" / "gone.py").unlink()  # deleted in the working tree: not copied
    files = mutate.repo_files(str(repo))
    assert set(files) == {
        ".gitignore",
        "pkg/__init__.py",
        "pkg/calc.py",
        "tests/test_calc.py",
        "tests/test_new.py",
    }
    mutate.copy_repo(str(repo), files, str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "pkg" / "calc.py").read_text() == CALC


def test_stale_mutants_are_reported_and_fail_the_run(repo, tmp_path):
    stale = [
        Mutant("gone-snippet", "pkg/calc.py", "return a * b", "return a / b", "b", ("tests/test_calc.py",)),
        Mutant("twice", "pkg/calc.py", "    return ", "    return -", "b", ("tests/test_calc.py",)),
        Mutant("gone-file", "pkg/old.py", "x", "y", "b", ("tests/test_calc.py",)),
        Mutant("gone-tests", "pkg/calc.py", "return x * 2", "return x", "b", ("tests/test_old.py",)),
    ]
    broken = Mutant("no-compile", "pkg/calc.py", "return x * 2", "return x *", "b", ("tests/test_calc.py",))
    code, report, echoed = run(repo, tmp_path, [KILLED, *stale, broken])
    assert code == 1
    by_id = {r["id"]: r for r in report["results"]}
    outcomes = {i: r["outcome"] for i, r in by_id.items()}
    assert outcomes == {
        "add-subtracts": "killed",  # the others still run
        "gone-snippet": "stale",
        "twice": "stale",
        "gone-file": "stale",
        "gone-tests": "stale",
        "no-compile": "error",
    }
    assert "is no longer in pkg/calc.py" in by_id["gone-snippet"]["detail"]
    assert "occurs 3 times" in by_id["twice"]["detail"]
    assert "tests/test_old.py" in by_id["gone-tests"]["detail"]
    assert "mutate: gone-snippet is stale" in echoed
    lines: list[str] = []
    assert mutate.main(["--list"], mutants=[KILLED, *stale], repo=str(repo), echo=lines.append) == 1
    assert "gone-snippet  [pkg/calc.py]  STALE: the original snippet is no longer in" in "\n".join(lines)
    assert (
        mutate.main(
            ["--list", "--only", "add-subtracts"], mutants=[KILLED, *stale], repo=str(repo), echo=lines.append
        )
        == 0
    )


def test_a_failing_baseline_stops_the_run(repo, tmp_path):
    (repo / "tests" / "test_calc.py").write_text(TESTS + "\n\ndef test_broken():\n    assert False\n")
    code, report, echoed = run(repo, tmp_path, [KILLED, SURVIVES])
    assert code == 2 and report["results"] == []
    assert "the tests fail without any mutant" in echoed and "test_broken" in echoed


def test_a_hanging_mutant_times_out_and_its_processes_are_killed(repo, tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    code, report, _ = run(repo, tmp_path, [HANGS], "--timeout", "5", "--no-baseline")
    assert code == 0 and report["results"][0]["outcome"] == "timeout"
    assert not _alive(int(pid_file.read_text()))


def test_killing_the_tool_leaves_the_checkout_and_no_copy_or_process_behind(repo, tmp_path):
    scratch, pid_file = tmp_path / "scratch", tmp_path / "pid"
    scratch.mkdir()
    before = files_of(repo)
    script = textwrap.dedent(f"""
        import signal, sys
        sys.path.insert(0, {os.path.join(ROOT, "tools")!r})
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import mutate
        from test_mutate import HANGS
        signal.signal(signal.SIGTERM, mutate._terminate)
        sys.exit(mutate.main(["--no-baseline", "--out", {str(tmp_path / "out")!r}], mutants=[HANGS],
                             repo={str(repo)!r}))
    """)
    env = {**os.environ, "TMPDIR": str(scratch), "PID_FILE": str(pid_file)}
    tool = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():  # the mutated code is running in the copy
        assert time.monotonic() < deadline and tool.poll() is None, tool.communicate()[0]
        time.sleep(0.1)
    assert os.listdir(scratch)  # the copy
    tool.send_signal(signal.SIGTERM)
    assert tool.wait(timeout=30) != 0
    assert not _alive(int(pid_file.read_text()))
    assert os.listdir(scratch) == []
    assert files_of(repo) == before


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has finished; only its parent has not read it yet
        return f.read().split(")")[-1].split()[0] != "Z"


# -- the real list ---------------------------------------------------------------------


def test_the_mutant_list_applies_to_the_current_code():
    """Every mutant's snippet is in its file exactly once and its tests exist: the list follows the code."""
    ids = [m.id for m in mutate.MUTANTS]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    problems = {m.id: mutate.stale_reason(m, ROOT) or mutate.compile_error(m, ROOT) for m in mutate.MUTANTS}
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, "update these mutants in tools/mutate.py (`tools/mutate.py --list`): " + json.dumps(
        problems, indent=1
    )
    assert all(m.bug and m.tests and m.file.startswith("xlapipe/") for m in mutate.MUTANTS)
    named = {i.split("-")[0] for i in ids if i.startswith("issue15.")}
    assert named >= {
        "issue15.1",
        "issue15.2",
        "issue15.3",
        "issue15.4a",
        "issue15.4b",
        "issue15.5",
        "issue15.6a",
        "issue15.6b",
    }
