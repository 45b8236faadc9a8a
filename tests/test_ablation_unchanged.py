"""A training script ablated as it is: each variant replaces its pipeline, the session measures it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xlapipe as xp
from xlapipe.ablation import Judging, Output, Runs, Variants, ablate
from xlapipe.ablation import results as store
from xlapipe.ablation.harness import with_user_changes

WORKLOADS = Path(__file__).parent / "workloads"
OWN = str(WORKLOADS / "own_loop.py")  # written for this test, not an example: no contract, no timer


def test_a_script_of_its_own_is_ablated_unchanged(tmp_path):
    res = ablate(
        OWN,
        ["--label", "mine"],
        judging=Judging(repeats=2, until_resolved=False),
        runs=Runs(metric="accuracy", timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
    )
    names = [v.name for v in res.variants]
    assert names == ["baseline", "full", "-with_device (and wrap_loader_mp)", "-wrap_loader_mp", "-log_every"]
    full = res["full"].variant.pipeline.describe()
    assert {
        "name": "log_every",
        "params": {"every": 4, "to": "__main__:show"},
    } in full  # the script's function
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["ok"] * 10, [r["error"][-500:] for r in records]
    assert {tuple(r["command"][1:]) for r in records} == {(OWN, "--label", "mine")}  # no flag of the runner's
    for r in records:
        report = r["report"]
        for key in ("first_update_s", "step_s", "epoch_s", "final_loss", "metric"):
            assert key in report, (r["variant"], key)
        assert report["epoch_steps"] == 12 and report["steps"] == 24  # two epochs of 192 / 16 batches
        assert 0 <= report["metric"] <= 1 and report["metric_name"] == "accuracy"
        assert ("compiles_total" in report) == ("with_device" in r["pipeline"])  # XLA runs count compilations
        log = Path(r["log"]).read_text()
        if "log_every" in r["pipeline"]:
            # the script's own function, with the script's own globals (its flags), under every variant
            assert "log [mine] step 4 " in log and "log [unset]" not in log
            assert "step 12 " in log and "lr 0.0005" in log  # the scheduler set after the pipeline is kept
        else:
            assert "log [" not in log
    assert all(s.interval is not None and s.interval.decided for s in res.summaries() if not s.is_baseline)
    assert "steady-state step" in (tmp_path / "ablation.md").read_text()


def test_a_script_that_never_opens_a_session_is_named(tmp_path):
    script = tmp_path / "no_session.py"
    script.write_text("print('training without xlapipe')\n")
    with pytest.raises(RuntimeError, match="never opened an xp.session.*--contract"):
        ablate(str(script), output=Output(tmp_path / "o", progress=False, echo=None))


def test_a_usage_error_of_the_script_is_shown_with_its_own_message(tmp_path):
    script = tmp_path / "argued.py"
    script.write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser(prog='argued.py')\n"
        "parser.add_argument('--epochs', type=int, required=True)\n"
        "parser.parse_args()\n"
    )
    with pytest.raises(RuntimeError) as refused:
        ablate(str(script), ["--no-such-flag"], output=Output(tmp_path / "o", progress=False, echo=None))
    assert "usage: argued.py [-h] --epochs EPOCHS" in str(refused.value)
    assert "argued.py: error: the following arguments are required: --epochs" in str(refused.value)


def test_a_pipeline_that_cannot_be_described_is_named_with_the_fix(tmp_path):
    script = tmp_path / "lambda_log.py"
    script.write_text(
        "import torch, xlapipe as xp\n"
        "pipeline = xp.Pipeline(xp.with_device(), xp.log_every(2, to=lambda record: None))\n"
        "setup = pipeline(xp.TrainingSetup(torch.nn.Linear(2, 2), None, {'train': []}))\n"
        "with xp.session(setup) as run:\n"
        "    pass\n"
    )
    with pytest.raises(RuntimeError, match="log_every's parameter 'to'.*top level of the script"):
        ablate(str(script), output=Output(tmp_path / "o", progress=False, echo=None))


def test_what_the_script_sets_after_its_pipeline_is_carried_to_every_variant():
    model = torch.nn.Linear(2, 2)
    setup = xp.Pipeline(xp.with_device(), xp.wrap_model_mp())(xp.TrainingSetup(model, None, {"train": [1]}))

    def schedule(opt):
        return opt

    later = setup.evolve(scheduler=schedule, loaders={"train": [2]})
    base = with_user_changes(later)
    assert base.applied == () and base.scheduler is schedule  # the scheduler: set after the pipeline
    assert base.loaders["train"] == [2]  # the pipeline leaves the loaders alone: the later ones are kept
    assert base.model is model  # wrap_model_mp replaced the model: the user's is the one before it
    assert with_user_changes(setup).scheduler is None


def test_a_variant_names_functions_of_the_script_it_runs_in(tmp_path, monkeypatch):
    from xlapipe.ablation.harness import describe, rebuild_in_script

    main = type(sys)("__main__")

    def show(record):
        return record

    show.__module__, show.__qualname__ = "__main__", "show"
    main.show = show
    monkeypatch.setitem(sys.modules, "__main__", main)
    described = describe(xp.Pipeline(xp.log_every(2, to=show)).transforms)
    assert described == [{"name": "log_every", "params": {"every": 2, "to": "__main__:show"}}]
    rebuilt = rebuild_in_script(json.loads(json.dumps(described)))
    assert dict(rebuilt["log_every"].params)["to"] is show  # the very function, not an import of it
    with pytest.raises(ValueError, match="cannot find again"):
        describe(xp.Pipeline(xp.log_every(2, to=lambda r: None)).transforms)


def test_a_script_that_never_ends_an_epoch_is_told_to_compare_its_step_time(tmp_path):
    tiny = str(WORKLOADS / "tiny_mlp.py")  # it leaves its loader loop early: no epoch ends
    two = [{"name": "eager", "pipeline": []}, {"name": "xla", "pipeline": [{"name": "with_device"}]}]
    res = ablate(
        tiny,
        ["--max-steps", "10", "--train-size", "256"],
        variants=Variants(mode="explicit", explicit=two),
        runs=Runs(warmup=2, timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
    )
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert {r["repeat"] for r in records} == {1}  # stopped after round 1
    xla = next(r["report"] for r in records if r["variant"] == "xla")
    # the warm-up ends where the compilations stop (a static-shape loop: within the first steps), and
    # a graph reused at every step (torch_xla's CachedCompile) is not a recompilation
    assert not xla.get("recompiles_throughout"), xla
    assert 2 <= xla["warmup_steps"] <= 4 and xla["measured_steps"] == 10 - xla["warmup_steps"], xla
    assert xla["step_s"] > 0 and xla["step_figure"] == "median"
    assert len(xla["step_times_s"]) == xla["measured_steps"]
    assert xla["step_s"] == pytest.approx(statistics.median(xla["step_times_s"]), abs=1e-5)
    note = " ".join(res.notes)
    assert "No run reports epoch_s" in note and "the runs report step_s" in note and "--figure" in note
    again = ablate(
        tiny,
        ["--max-steps", "10", "--train-size", "256"],
        variants=Variants(mode="explicit", explicit=two),
        judging=Judging(figure="step_s", repeats=2, until_resolved=False),
        runs=Runs(warmup=2, timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
    )
    assert len(store.load(tmp_path / store.RESULTS_FILE)) == 4  # round 1 resumed, round 2 run
    assert again["xla"].interval.n == 2


def test_a_run_too_short_for_a_steady_state_is_a_failed_row_with_the_steps_it_would_need(tmp_path):
    tiny = str(WORKLOADS / "tiny_mlp.py")
    res = ablate(
        tiny,
        ["--max-steps", "4", "--train-size", "64"],
        variants=Variants(mode="explicit", explicit=[{"name": "xla", "pipeline": [{"name": "with_device"}]}]),
        runs=Runs(warmup=2, timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
    )
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["error"]  # one round: then the rounds stop
    assert records[0]["error"].startswith("too short to measure: the run trained 4 steps")
    note = " ".join(res.notes)
    assert "Every run was too short to measure" in note and "steps or more" in note
    assert res["xla"].failed.startswith("too short to measure")


def test_the_ablate_command_never_imports_torch_in_its_own_process(tmp_path):
    # issues 28/29: the driver plans with outlines; the runs (and one checking child) import torch
    code = (
        "import sys\n"
        "from xlapipe.cli import main\n"
        "argv = sys.argv[1:]\n"
        "code = main(argv)\n"
        "print('TORCH', 'torch' in sys.modules, code)\n"
    )
    common = ["--repeats", "1", "--no-until-resolved", "--no-progress", "--timeout", "300"]
    discovered = ["ablate", OWN, "--out", str(tmp_path / "a"), "--mode", "add-one", *common]
    given = [
        "ablate",
        OWN,
        "--out",
        str(tmp_path / "b"),
        "--import",
        "my_practice",
        "--pipeline",  # with a practice of the user's own that the script never imports: the runs import it
        json.dumps(
            [
                {"name": "with_device"},
                {"name": "wrap_loader_mp"},
                {"name": "count_steps", "params": {"label": "mine"}},
            ]
        ),
        *common,
    ]
    for argv in (discovered, given):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=WORKLOADS, timeout=900
        )
        assert "TORCH False 0" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    records = store.load(tmp_path / "b" / store.RESULTS_FILE)
    assert {r["status"] for r in records} == {"ok"}, [r["error"][-500:] for r in records]
    logs = [p.read_text() for p in (tmp_path / "b").rglob("*.log")]
    assert any("mine: a step" in text for text in logs), "the user's practice did not run"
    # a bad pipeline is refused from the checking child with the registry's own message, before any run;
    # so is a bad --import
    bad = [*given[:3], str(tmp_path / "c"), *given[4:7], json.dumps([{"name": "wrap_loader_mp"}]), *common]
    done = subprocess.run(
        [sys.executable, "-c", code, *bad], capture_output=True, text=True, cwd=WORKLOADS, timeout=300
    )
    assert "wrap_loader_mp needs with_device before it" in done.stderr, done.stderr[-2000:]
    bad[5] = "no_such_module_xyz"
    done = subprocess.run(
        [sys.executable, "-c", code, *bad], capture_output=True, text=True, cwd=WORKLOADS, timeout=300
    )
    assert "cannot import 'no_such_module_xyz'" in done.stderr, done.stderr[-2000:]
    assert store.load(tmp_path / "c" / store.RESULTS_FILE) == []


def test_a_function_target_imports_the_practices_its_variants_name(tmp_path, monkeypatch):
    # --import reaches the run's worker too, not only the driver's check: tiny_mlp never imports my_practice
    monkeypatch.chdir(WORKLOADS)
    mine = {"name": "count_steps", "params": {"label": "mine"}}
    ablate(
        "tiny_mlp:train",
        {"max_steps": 12, "warmup": 2, "train_size": 256},
        variants=Variants(
            mode="explicit", explicit=[{"name": "mine", "pipeline": [mine]}], imports=["my_practice"]
        ),
        judging=Judging(repeats=1, until_resolved=False),
        runs=Runs(warmup=2, timeout=300),
        output=Output(tmp_path, progress=False, echo=None),
    )
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["ok"], [r["error"][-500:] for r in records]
    assert "--import" in records[0]["command"] and "my_practice" in records[0]["command"]
    assert any("mine: a step" in p.read_text() for p in tmp_path.rglob("*.log"))
