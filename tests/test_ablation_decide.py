"""The ablation decides: repeats until resolved within a budget, phases, and a recommendation that runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import xlapipe as xp
from xlapipe.ablation import ablate
from xlapipe.ablation import results as store

WORKLOADS = Path(__file__).parent / "workloads"
SCRIPT = str(WORKLOADS / "tiny_mlp.py")
SYNTHETIC = f"{WORKLOADS / 'synthetic.py'}:train"
ROOT = Path(__file__).resolve().parent.parent
P = xp.Pipeline
TWO = [{"name": "reference", "pipeline": []}, {"name": "variant", "pipeline": [{"name": "with_device"}]}]


def test_until_resolved_stops_at_its_budget_and_names_what_stayed_unresolved(tmp_path):
    budget = 40.0
    # no true difference, 60% noise, asked for ±1%: never resolved, so only the budget can stop it
    kwargs = {"times": {"": 1.0, "with_device": 1.0}, "noise": 0.6, "sleep": 0.4}
    start = time.monotonic()
    res = ablate(
        SYNTHETIC,
        mode="explicit",
        variants=TWO,
        kwargs=kwargs,
        out=tmp_path,
        until_resolved=True,
        budget=budget,
        resolution=0.01,
        progress=False,
        echo=None,
    )
    took = time.monotonic() - start
    longest = max(r["elapsed_s"] for r in store.load(tmp_path / store.RESULTS_FILE))
    assert took <= budget + longest + 5  # it stops starting runs once the budget is spent
    records = store.load(tmp_path / store.RESULTS_FILE)
    repeats = {r["repeat"] for r in records}
    assert len(repeats) >= 3, "the loop added rounds"
    assert res.unresolved == ("variant",)
    note = " ".join(res.notes)
    assert "Unresolved when the budget" in note and "variant" in note
    assert "Unresolved" in (tmp_path / "ablation.md").read_text()
    # every added round is interleaved: the reference and the variant have the same repeats
    by = {
        name: sorted(r["repeat"] for r in records if r["variant"] == name)
        for name in ("reference", "variant")
    }
    assert by["reference"] == by["variant"]


def test_until_resolved_stops_when_every_variant_is_resolved(tmp_path):
    kwargs = {"times": {"": 2.0, "with_device": 1.0}, "noise": 0.02}
    res = ablate(
        SYNTHETIC,
        mode="explicit",
        variants=TWO,
        kwargs=kwargs,
        out=tmp_path,
        until_resolved=True,
        budget="10m",
        progress=False,
        echo=None,
    )
    assert res.unresolved == () and res["variant"].verdict.word == "faster"
    assert res["variant"].interval.n == 6  # the fewest paired repeats a 95% interval needs
    assert any(n.startswith("Resolved") for n in res.notes)
    ablate(
        SYNTHETIC,
        mode="explicit",
        variants=TWO,
        kwargs=kwargs,
        out=tmp_path,
        until_resolved=True,
        progress=False,
        echo=None,
    )
    assert len(store.load(tmp_path / store.RESULTS_FILE)) == 12  # resumed, already resolved: nothing run


def test_a_budget_alone_stops_the_planned_repeats(tmp_path):
    kwargs = {"times": {"": 1.0}, "sleep": 1.0}
    res = ablate(
        SYNTHETIC,
        mode="explicit",
        variants=TWO,
        kwargs=kwargs,
        out=tmp_path,
        repeats=200,
        budget=20,
        progress=False,
        echo=None,
    )
    assert 0 < len(store.load(tmp_path / store.RESULTS_FILE)) < 40
    assert any("Budget of 20 s spent" in n for n in res.notes)


def test_the_main_job_shape_eager_row_phases_and_a_recommendation_that_runs(tmp_path):
    """Add-one from with_device with eager PyTorch as an extra row, on the tiny workload; then run the advice."""
    args = [
        "--max-steps",
        "6",
        "--warmup",
        "2",
        "--train-size",
        "96",
        "--eval-size",
        "32",
        "--eval-every",
        "3",
        "--no-model-mp",
    ]
    res = ablate(
        SCRIPT,
        mode="add-one",
        args=args,
        baseline=["with_device"],
        eager_reference=True,
        out=tmp_path,
        timeout=300,
        target_metric=0.0,
        progress=False,
        echo=None,
    )
    names = [v.name for v in res.variants]
    assert names == ["eager", "baseline", "+wrap_loader_mp", "+set_default_tensor_type"]
    assert res["baseline"].variant.pipeline == P(xp.with_device()) and res["eager"].variant.pipeline == P()
    assert res.ok, [s.errors for s in res.summaries()]
    for key in ("first_update_s", "step_s", "eval_s", "time_to_target_s"):
        assert key in res["baseline"].figures, key
    assert res["+wrap_loader_mp"].figures["first_update_s"].median > 0
    assert (tmp_path / "phases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "ablation.md").read_text()
    assert "## Phases" in md and "## Recommended pipeline" in md and "time to the first update" in md
    csv_head = (tmp_path / "ablation.csv").read_text().splitlines()[0]
    assert "speedup_low" in csv_head and "verdict" in csv_head

    rec = res.recommendation
    assert rec is not None and rec.variant in names
    description = json.loads((tmp_path / "recommended.json").read_text())
    assert P.from_description(description) == rec.pipeline
    scope: dict = {}
    exec((tmp_path / "recommended.py").read_text(), scope)
    assert scope["pipeline"] == rec.pipeline
    # the workload runs the recommendation as given, through its --pipeline flag
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    report = tmp_path / "recommended-run.json"
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--max-steps",
            "3",
            "--warmup",
            "1",
            "--pipeline",
            json.dumps(description),
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    ran = json.loads(report.read_text())
    assert ran["pipeline_description"] == description and ran["final_loss"] == ran["final_loss"]
