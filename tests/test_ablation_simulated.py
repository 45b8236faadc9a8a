"""The ablation's decisions on simulated ablations with a known answer (pure Python, no runs).

Each simulated table is the main job's shape: an eager row, the reference and
five rows, each with a true time per epoch. Every run's figure is the truth
times the machine's state in its round (shared by the round's runs: what
pairing cancels) times the run's own noise: log-normal, larger for some rows
than for others, with now and then a run much slower or faster than the
rest. The rounds are decided as the runner decides them: ``repeats`` rounds of
every row, then rounds of the reference and the rows still unresolved, up to
``max_rounds``. Fixed seeds: the numbers in the assertions are reproducible.
"""

from __future__ import annotations

import math
import random

import pytest

import xlapipe as xp
from xlapipe.ablation import Judging, Results, Variant

P = xp.Pipeline
ROWS = [  # name, pipeline, true time per epoch (s), run-to-run noise (log sd)
    ("eager", P(), 12.0, 0.06),
    ("baseline", P(xp.with_device()), 75.0, 0.03),
    ("+static_shapes", P(xp.with_device(), xp.static_shapes(length=64)), 24.0, 0.02),
    ("+hf_traced_masks", P(xp.with_device(), xp.static_shapes(length=64), xp.hf_traced_masks()), 24.0, 0.02),
    ("+wrap_model_mp", P(xp.with_device(), xp.static_shapes(length=64), xp.hf_traced_masks(), xp.wrap_model_mp()), 24.0, 0.02),
    ("+wrap_loader_mp", P(xp.with_device(), xp.static_shapes(length=64), xp.hf_traced_masks(), xp.wrap_model_mp(), xp.wrap_loader_mp()), 23.0, 0.03),
]  # fmt: skip
VARIANTS = [Variant(name, pipeline) for name, pipeline, _, _ in ROWS]
TRUTH = {name: seconds for name, _, seconds, _ in ROWS}
NOISE = {name: sd for name, _, _, sd in ROWS}


def _run(rng: random.Random, name: str, spell: float) -> float:
    outlier = math.log(1.25) * rng.choice((-1, 1)) if rng.random() < 0.05 else 0.0
    return TRUTH[name] * spell * math.exp(rng.gauss(0, NOISE[name]) + outlier)


def _record(variant: Variant, round_: int, epoch_s: float) -> dict:
    report = {"epoch_s": epoch_s, "final_loss": 0.7, "metric": 0.5}
    return {
        "variant": variant.name,
        "pipeline_description": variant.description,
        "repeat": round_,
        "status": "ok",
        "report": report,
    }


def simulate(seed: int, judging: Judging, truth: dict[str, float] | None = None) -> Results:
    """One ablation, decided round by round as the runner decides it."""
    rng = random.Random(seed)
    records: list[dict] = []
    results = Results(VARIANTS, "baseline", records, judging)
    for round_ in range(1, judging.rounds + 1):
        if round_ > judging.repeats:
            unresolved = results.unresolved
            if not judging.until_resolved or not unresolved:
                break
            todo = [v for v in VARIANTS if v.name in ("baseline", *unresolved)]
        else:
            todo = VARIANTS
        spell = math.exp(rng.gauss(0, 0.1))  # the machine's state in this round, shared by its runs
        records += [_record(v, round_, _run(rng, v.name, spell)) for v in todo]
        results = Results(VARIANTS, "baseline", records, judging)
    return results


def _true_speedup(name: str) -> float:
    return TRUTH["baseline"] / TRUTH[name]


def test_intervals_keep_their_coverage_over_simulated_tables():
    judging = Judging()  # the defaults: 3 rounds, then up to 6 for the undecided rows, 95%
    covered = total = 0
    rounds = []
    for seed in range(300):
        res = simulate(seed, judging)
        for s in res.summaries():
            if s.is_baseline:
                continue
            iv = s.interval
            assert iv is not None and iv.decided  # three rounds give every row an interval
            total += 1
            covered += iv.low <= _true_speedup(s.variant.name) <= iv.high
        rounds.append(max(r["repeat"] for r in res.records))
    assert covered / total >= 0.95, covered / total
    assert sum(r == 3 for r in rounds) / len(rounds) >= 0.9  # the big effects are decided in 3 rounds


def test_the_main_jobs_rows_are_decided_as_the_truth_says():
    words = {name: set() for name in TRUTH if name != "baseline"}
    for seed in range(200):
        res = simulate(seed, Judging())
        for name in words:
            words[name].add(res[name].verdict.word)
    assert all(w == {"faster"} for w in words.values()), words


REF = Variant("baseline", P(xp.with_device()))
SAME = Variant("same", P(xp.with_device(), xp.wrap_model_mp()))


def _equal_rows(seed: int, noise: float = 0.02, outliers: float = 0.05, rounds: int = 6) -> list[dict]:
    """The reference and a row with no effect: run-to-run noise ``noise``, and now and then a 20% outlier."""
    rng = random.Random(seed)
    records = []
    for round_ in range(1, rounds + 1):
        spell = math.exp(rng.gauss(0, 0.1))
        for v in (REF, SAME):
            jump = math.log(1.2) * rng.choice((-1, 1)) if rng.random() < outliers else 0.0
            records.append(_record(v, round_, 20.0 * spell * math.exp(rng.gauss(0, noise) + jump)))
    return records


def _decide(records: list[dict], judging: Judging, look: Judging | None = None):
    """The row's verdict as the runner reaches it: looked at after each round from ``repeats`` on and
    stopped when resolved (each look judged by ``look``, by default by ``judging`` itself)."""
    for n in range(judging.repeats, judging.rounds + 1):
        res = Results([REF, SAME], "baseline", [r for r in records if r["repeat"] <= n], look or judging)
        if res["same"].verdict.resolved:
            break
    return res["same"].verdict


@pytest.mark.parametrize("noise, outliers", [(0.02, 0.05), (0.05, 0.0)])
def test_a_variant_with_no_effect_is_called_different_no_more_often_than_the_level_allows(noise, outliers):
    judging, tables = Judging(), 1000
    verdicts = [_decide(_equal_rows(seed, noise, outliers), judging) for seed in range(tables)]
    different = sum(v.word in ("faster", "slower") for v in verdicts)
    assert different / tables <= 1 - judging.confidence, different  # looked at after every round from 3 to 6


def test_looking_after_every_round_needs_the_split_confidence():
    """The same tables of a noisy row (it takes several looks), each look at 95%: too many false alarms."""
    judging, tables = Judging(), 1000
    naive = Judging(until_resolved=False)  # one look's worth of confidence, spent at every look
    verdicts = [_decide(_equal_rows(seed, 0.05, 0.0), judging, look=naive) for seed in range(tables)]
    different = sum(v.word in ("faster", "slower") for v in verdicts)
    assert different / tables > 1 - judging.confidence, different


def test_with_quiet_runs_a_variant_with_no_effect_is_shown_within_the_resolution():
    judging = Judging()
    verdicts = [_decide(_equal_rows(seed, noise=0.01, outliers=0.0), judging) for seed in range(300)]
    within = sum(v.word == "no detectable difference" and v.resolved for v in verdicts)
    assert within / len(verdicts) >= 0.9, within  # within ±5% by the sixth round


def _ties(seed: int) -> Results:
    """Four rows equally fast (of 2 to 5 transforms), one 15% slower; six rounds."""
    rng = random.Random(seed)
    wd, ss, hf, mp, ld = (
        xp.with_device(),
        xp.static_shapes(length=64),
        xp.hf_traced_masks(),
        xp.wrap_model_mp(),
        xp.wrap_loader_mp(),
    )
    rows = [
        (Variant("baseline", P(wd)), 60.0),
        (Variant("five", P(wd, ss, hf, mp, ld)), 20.0),
        (Variant("three", P(wd, ss, hf)), 20.0),
        (Variant("four", P(wd, ss, hf, mp)), 20.0),
        (Variant("two", P(wd, ss)), 23.0),
        (Variant("two too", P(wd, mp)), 20.0),
    ]
    records = []
    for round_ in range(1, 7):
        spell = math.exp(rng.gauss(0, 0.1))
        for v, t in rows:
            records.append(_record(v, round_, t * spell * math.exp(rng.gauss(0, 0.02))))
    return Results([v for v, _ in rows], "baseline", records, Judging(until_resolved=False, repeats=6))


def test_the_recommendation_is_the_simplest_of_the_fastest_and_the_same_on_every_rerun():
    picks, fastest = [], []
    for seed in range(200):
        res = _ties(seed)
        picks.append(res.recommendation.variant)
        fastest.append(min(res.summaries()[1:], key=lambda s: s.figures["epoch_s"].median).variant.name)
    assert picks.count("two too") / len(picks) >= 0.95, {p: picks.count(p) for p in set(picks)}
    assert len(set(fastest)) >= 3  # the fastest median is noise: it changes from rerun to rerun
    res = _ties(0)
    assert "simplest variant (2 transforms) with no detectable difference from the fastest" in (
        res.recommendation.reason
    )
    assert set(res.recommendation.alternatives) >= {"three", "four", "five"}
    assert "two" not in res.recommendation.alternatives  # 15% slower: told apart
