"""tools/op_sweep.py: PyTorch's OpInfo samples on the XLA device against eager, with and without xlapipe's fixes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ["nn.functional.elu", "norm.inf", "add"]  # two torch_xla 2.9 gets wrong, one it gets right


def swept(out: Path, *flags: str) -> dict[str, dict]:
    cmd = [sys.executable, str(ROOT / "tools" / "op_sweep.py"), "--only", *OPS, "--out", str(out), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (out / "summary.md").exists()
    return {r["op"]: r for r in records}


def test_the_sweep_finds_what_torch_xla_gets_wrong_and_the_sessions_fixes_leave_nothing(tmp_path):
    plain = swept(tmp_path / "plain")
    assert set(plain) == set(OPS)
    assert plain["add"]["status"] == "match"
    assert plain["nn.functional.elu"]["status"] == "mismatch"
    elu = [d for s in plain["nn.functional.elu"]["samples"] for d in s["differences"]]
    assert elu and all(d.startswith("gradient") for d in elu)  # the forward is right, the gradient is not
    assert any(d.startswith("output") for s in plain["norm.inf"]["samples"] for d in s["differences"])
    corrected = swept(tmp_path / "corrected", "--corrected")  # with_device's and compile_step's kernels
    assert {op: r["status"] for op, r in corrected.items()} == dict.fromkeys(OPS, "match")
