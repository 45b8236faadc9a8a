"""The ablation decides: rounds until resolved within a budget and a cap, phases, a recommendation that runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import xlapipe as xp
from xlapipe.ablation import Judging, Output, Results, Runs, Variants, ablate
from xlapipe.ablation import results as store
from xlapipe.ablation.runner import FIRST_RUN_LIMIT, run_limit

WORKLOADS = Path(__file__).parent / "workloads"
SCRIPT = str(WORKLOADS / "tiny_mlp.py")
SYNTHETIC = f"{WORKLOADS / 'synthetic.py'}:train"
FAULTY = f"{WORKLOADS / 'faulty.py'}:train"
ROOT = Path(__file__).resolve().parent.parent
P = xp.Pipeline
TWO = [{"name": "reference", "pipeline": []}, {"name": "variant", "pipeline": [{"name": "with_device"}]}]


def _explicit(tmp_path, kwargs: dict, judging: Judging, target: str = SYNTHETIC, variants=TWO) -> Results:
    return ablate(
        target,
        kwargs,
        variants=Variants(mode="explicit", explicit=variants),
        judging=judging,
        output=Output(tmp_path, progress=False, echo=None),
    )


def test_until_resolved_stops_at_its_budget_and_names_what_stayed_unresolved(tmp_path):
    budget = 60.0  # each run is a fresh interpreter that imports torch: 5 to 15 s here
    # no true difference, 60% noise, asked for ±1%: never resolved, so only the budget can stop it
    kwargs = {"times": {"": 1.0, "with_device": 1.0}, "noise": 0.6, "sleep": 0.4}
    # (that no run starts which would not fit is checked on a simulated clock: test_ablation_rounds)
    judging = Judging(repeats=2, budget=budget, resolution=0.01, max_rounds=1000)
    res = _explicit(tmp_path, kwargs, judging)
    records = store.load(tmp_path / store.RESULTS_FILE)
    repeats = {r["repeat"] for r in records}
    assert repeats  # (how many rounds fit depends on the machine's load: not asserted)
    assert res.unresolved == ("variant",)
    note = " ".join(res.notes)
    assert (
        "Unresolved when the budget" in note or "would not fit in what was left" in note
    ) and "variant" in note
    assert "Unresolved" in (tmp_path / "ablation.md").read_text()
    # every added round runs both rows, in its random order; only a last round the budget cut after
    # its first run (that run overran its estimate: 60% noise) may have one of them
    by = {name: {r["repeat"] for r in records if r["variant"] == name} for name in ("reference", "variant")}
    extra = by["reference"] ^ by["variant"]
    assert len(extra) <= 1 and all(e > max(by["reference"] & by["variant"], default=0) for e in extra)
    if extra:
        assert "would not fit" in note


def test_until_resolved_stops_when_every_variant_is_resolved(tmp_path):
    kwargs = {"times": {"": 2.0, "with_device": 1.0}, "noise": 0.02}
    res = _explicit(tmp_path, kwargs, Judging(budget="10m"))
    assert res.unresolved == () and res["variant"].verdict.word == "faster"
    assert res["variant"].interval.n == 3  # the first look, after the three rounds every variant gets
    assert any(n.startswith("Resolved") for n in res.notes)
    _explicit(tmp_path, kwargs, Judging())
    assert len(store.load(tmp_path / store.RESULTS_FILE)) == 6  # resumed, already resolved: nothing run


def test_a_budget_alone_stops_the_planned_repeats(tmp_path):
    kwargs = {"times": {"": 1.0}, "sleep": 1.0}
    res = _explicit(tmp_path, kwargs, Judging(repeats=10**12, until_resolved=False, budget=20))
    assert len(store.load(tmp_path / store.RESULTS_FILE)) < 40  # and no job list of 10**12 was built
    assert any(n.startswith("Budget of 20 s: after") and "would not fit" in n for n in res.notes)


def test_until_resolved_ends_when_the_reference_always_fails(tmp_path):
    variants = [
        {"name": "reference", "pipeline": [{"name": "set_default_tensor_type"}]},
        {"name": "variant", "pipeline": []},
    ]
    kwargs = {"fail_if": "set_default_tensor_type", "max_steps": 2, "warmup": 1}
    res = _explicit(tmp_path, kwargs, Judging(max_rounds=1000), target=FAULTY, variants=variants)
    rounds = {r["repeat"] for r in store.load(tmp_path / store.RESULTS_FILE)}
    assert rounds == {1, 2, 3, 4, 5}  # three rounds, then two that added no pair
    assert "the last two rounds added no paired run" in " ".join(res.notes)
    assert res["variant"].verdict.word == "undecided"


def test_the_first_run_of_a_variant_has_an_hour_and_later_ones_four_times_its_longest():
    assert run_limit(None, []) == FIRST_RUN_LIMIT == 3600
    assert run_limit(None, [100.0, 250.0]) == 1000.0
    assert run_limit(None, [1.0]) == 120.0  # at least two minutes
    assert run_limit(900.0, [2000.0]) == 900.0  # a limit asked for is kept


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
        args,
        variants=Variants(mode="add-one", baseline=["with_device"], eager_reference=True),
        judging=Judging(repeats=1, until_resolved=False, target_metric=0.0),
        runs=Runs(contract=True, timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
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
