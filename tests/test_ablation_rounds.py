"""The runner's rounds on a simulated clock: the budget, max_rounds, the random order (no process, no wall time)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import xlapipe as xp
from xlapipe.ablation import Judging, Output, Runs
from xlapipe.ablation import results as store
from xlapipe.ablation.runner import Budget, _Runner, order_seed, schedule, shuffled
from xlapipe.ablation.target import Target
from xlapipe.ablation.variants import explicit

P = xp.Pipeline
PLAN = explicit(
    [
        {"name": "reference", "pipeline": []},
        {"name": "a", "pipeline": [{"name": "with_device"}]},
        {"name": "b", "pipeline": [{"name": "with_device"}, {"name": "wrap_loader_mp"}]},
    ]
)


class _Server:
    warm_mode = False


class SimulatedRunner(_Runner):
    """The real rounds and records; each run takes ``seconds[name]`` on a simulated clock."""

    def __init__(self, out: Path, judging: Judging, seconds: dict[str, float], noise: float, seed: int = 0):
        self.now = [0.0]
        self.seconds, self.noise, self.rng = seconds, noise, random.Random(seed)
        self.started: list[tuple[str, float, float]] = []  # (variant, start, end) on the clock
        budget = Budget(judging.budget, clock=lambda: self.now[0])
        tgt = Target("m:f", "function")
        runs_dir = out / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        output = Output(out, progress=False, echo=None)
        super().__init__(PLAN, tgt, runs_dir, _Server(), Runs(), judging, output, budget)  # type: ignore[arg-type]

    def execute(self, cmd, limit, log, report, env):
        description = json.loads(cmd[cmd.index("--pipeline") + 1])
        name = next(v.name for v in PLAN.variants if v.description == description)
        times = self.seconds[name]
        done = sum(1 for n, _, _ in self.started if n == name)
        took = times[done % len(times)] if isinstance(times, list) else times
        self.started.append((name, self.now[0], self.now[0] + took))
        self.now[0] += took
        value = 10.0 * (1 + self.rng.uniform(-self.noise, self.noise))
        return {
            "status": "ok",
            "report": {"epoch_s": value, "final_loss": 0.5},
            "error": "",
            "elapsed_s": took,
        }


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
