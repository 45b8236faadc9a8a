"""The runner's rounds on a simulated clock: the budget, max_rounds, the random order (no process, no wall time)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import xlapipe as xp
from xlapipe.ablation import Judging
from xlapipe.ablation import results as store
from xlapipe.ablation.runner import order_seed, schedule, shuffled
from xlapipe.ablation.variants import Plan, add_one, explicit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.driver import simulated_runner  # noqa: E402 - the bench measures the driver with it too

P = xp.Pipeline
PLAN = explicit(
    [
        {"name": "reference", "pipeline": []},
        {"name": "a", "pipeline": [{"name": "with_device"}]},
        {"name": "b", "pipeline": [{"name": "with_device"}, {"name": "wrap_loader_mp"}]},
    ]
)


def SimulatedRunner(out: Path, judging: Judging, seconds: dict, noise: float, plan: Plan = PLAN, **kw):
    """The real rounds and records, on a simulated clock and ``slots`` simulated machines."""
    return simulated_runner(out, judging, seconds, noise, plan=plan, **kw)


def test_the_budget_starts_no_run_that_cannot_fit_in_what_is_left(tmp_path):
    judging = Judging(budget=140, repeats=1000, until_resolved=False)  # only the budget stops it
    # b's runs take 25 s, then 10 s twice: its median (10 s) is no estimate of what a run may take
    seconds = {"reference": 10.0, "a": 10.0, "b": [25.0, 10.0, 10.0]}
    runner = SimulatedRunner(tmp_path, judging, seconds, noise=0.5)
    notes = runner.run()
    assert runner.started, "it ran"
    # (estimated by b's median, its run of 25 s would have started at 125 s and ended at 150 s)
    assert all(end <= 140 for _, _, end in runner.started), runner.started[-3:]
    assert runner.now[0] > 140 - 25  # it stopped only when the next run might not fit
    assert any("would not fit in what was left" in n for n in notes), notes


def test_the_added_rounds_reach_max_rounds(tmp_path):
    judging = Judging(max_rounds=5, resolution=0.001)  # never resolved
    runner = SimulatedRunner(tmp_path, judging, {"reference": 1.0, "a": 1.0, "b": 1.0}, noise=0.5)
    notes = runner.run()
    rounds = {r["repeat"] for r in store.load(tmp_path / store.RESULTS_FILE)}
    assert rounds == {1, 2, 3, 4, 5}
    assert any("after 5 rounds" in n for n in notes), notes


def test_a_budget_that_stops_the_added_rounds_says_what_would_decide_them(tmp_path):
    judging = Judging(budget=10, resolution=0.001)  # three rounds of three 1-s runs fit, a fourth does not
    runner = SimulatedRunner(tmp_path, judging, {"reference": 1.0, "a": 1.0, "b": 1.0}, noise=0.5)
    (note,) = [n for n in runner.run() if "Unresolved when the budget" in n]
    assert re.search(
        r"Deciding them within ±0% would take about \d+ paired rounds in all, about \d+ (s|min) more", note
    )


def test_rounds_for_undecided_increments_go_on_without_the_baseline(tmp_path):
    """The baseline is decided after 3 rounds and not run again; the increments' rounds still count.

    Found on the main job: round 5 stopped it with "the last two rounds added no paired run (the
    rows compared failed)", no run having failed, 7 minutes of its budget left.
    """
    full = P(xp.with_device(), xp.wrap_loader_mp(), xp.set_default_tensor_type())
    plan = add_one(full, baseline=["with_device"])
    judging = Judging(max_rounds=6, resolution=0.001)  # the increments are never resolved
    names = [v.name for v in plan.variants]
    seconds = dict.fromkeys(names, 1.0)
    runner = SimulatedRunner(tmp_path, judging, seconds, 0.3, plan=plan, truth={"baseline": 1000.0})
    notes = runner.run()
    ran = {}
    for r in store.load(tmp_path / store.RESULTS_FILE):
        ran.setdefault(r["repeat"], set()).add(r["variant"])
    assert sorted(ran) == [1, 2, 3, 4, 5, 6], notes
    assert "baseline" not in ran[4] | ran[5] | ran[6]  # decided: not run again
    assert not any("added no paired run" in n for n in notes), notes
    (note,) = [n for n in notes if "after 6 rounds" in n]
    # what deciding them would take: the rounds, and the time of the rows they need (1 s each, one machine)
    m = re.search(r"would take about (\d+) paired rounds in all, about (\d+) s more at this run's pace", note)
    assert m, note
    rows = len(names) - 1  # every row but the baseline (decided) is unresolved or compared with one
    assert int(m.group(1)) > 6 and int(m.group(2)) == (int(m.group(1)) - 6) * rows, note


def test_each_round_runs_in_a_seeded_random_order_that_is_recorded(tmp_path):
    judging = Judging(repeats=6, until_resolved=False)
    runner = SimulatedRunner(tmp_path, judging, {"reference": 1.0, "a": 1.0, "b": 1.0}, noise=0.01)
    runner.run()
    records = store.load(tmp_path / store.RESULTS_FILE)
    orders = {}
    for r in records:
        orders.setdefault(r["repeat"], []).append((r["position"], r["variant"]))
        assert r["order_seed"] == order_seed(runner.tgt.config, r["repeat"])
        assert r["machine"]["host"] and r["format"] == store.FORMAT
    shown = [tuple(name for _, name in sorted(o)) for o in orders.values()]
    assert all(sorted(o) == ["a", "b", "reference"] for o in shown)
    assert len(set(shown)) > 1  # not the plan's order every round
    # the order of a round is a function of the target and the round: a resume gets the same one
    todo = [(4, i, v) for i, v in enumerate(PLAN.variants)]
    assert [v.name for _, _, v in shuffled(todo, runner.tgt.config)] == list(shown[3])
    assert [v.name for _, _, v in schedule(PLAN, 1)] == [
        "reference",
        "a",
        "b",
    ]  # without a config: plan order


def test_on_three_machines_each_round_runs_whole_on_one_and_the_wall_time_is_near_a_third(tmp_path):
    judging = Judging(repeats=6, until_resolved=False)
    seconds = {"reference": 10.0, "a": 10.0, "b": 10.0}
    one = SimulatedRunner(tmp_path / "one", judging, seconds, noise=0.01)
    one.run()
    three = SimulatedRunner(tmp_path / "three", judging, seconds, noise=0.01, slots=3)
    three.run()
    records = store.load(tmp_path / "three" / store.RESULTS_FILE)
    assert len(records) == 18
    by_round: dict[int, set[str]] = {}
    for r in records:
        by_round.setdefault(r["repeat"], set()).add(r["machine"]["node"])
    assert all(len(m) == 1 for m in by_round.values()), by_round  # a round is one block: one machine
    assert len({m for ms in by_round.values() for m in ms}) == 3  # every machine took rounds
    assert one.now[0] / three.now[0] >= 0.6 * 3, (one.now[0], three.now[0])


def test_on_many_machines_the_first_rounds_fill_whole_waves_up_to_max_rounds(tmp_path):
    # 3 rounds asked on 8 machines: 5 would sit idle while 3 run, then run the undecided rounds after.
    judging = Judging(repeats=3, max_rounds=6, resolution=0.001)  # never resolved
    seconds = {"reference": 10.0, "a": 10.0, "b": 10.0}
    eight = SimulatedRunner(tmp_path / "eight", judging, seconds, noise=0.3, slots=8)
    notes = eight.run()
    records = store.load(tmp_path / "eight" / store.RESULTS_FILE)
    assert sorted({r["repeat"] for r in records}) == [1, 2, 3, 4, 5, 6]  # max_rounds, not 8
    assert len(records) == 18
    assert eight.now[0] == 30.0  # one wave: every round at once, each whole on one machine
    assert any("after 6 rounds" in n for n in notes), notes
    fixed = Judging(repeats=3, until_resolved=False)  # exactly the rounds asked
    exact = SimulatedRunner(tmp_path / "exact", fixed, seconds, noise=0.3, slots=8)
    exact.run()
    assert {r["repeat"] for r in store.load(tmp_path / "exact" / store.RESULTS_FILE)} == {1, 2, 3}
    two = SimulatedRunner(tmp_path / "two", judging, seconds, noise=0.3, slots=2)
    two.run()  # 3 asked on 2 machines: rounds 1-2, then 3-4 (the second machine not left idle)
    assert two.fixed == 4


def test_the_driver_of_100_variants_by_10_rounds_stays_small_and_never_imports_torch(tmp_path):
    # issues 28/29: the driver under 500 MB for 1,000 records; importing torch alone is about 500 MB
    repo = Path(__file__).resolve().parent.parent
    argv = ["--variants", "100", "--rounds", "10", "--machines", "8", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.driver", *argv], capture_output=True, text=True, cwd=repo, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["records"], report["variants"]) == (1000, 100)
    assert report["torch_loaded"] is False
    assert report["peak_rss_mb"] < 500, report
    assert {"ablation.md", "ablation.png", "results.jsonl"} <= {p.name for p in tmp_path.iterdir()}
