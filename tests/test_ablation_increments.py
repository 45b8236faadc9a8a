"""What each practice adds to the row before it: increments, Holm, the A/A pair, the learning check,
the recommendation among XLA rows, the warm-up found per run, old results files (pure Python, no runs)."""

from __future__ import annotations

import json
import math
import random

import pytest

import xlapipe as xp
from xlapipe.ablation import Judging, Results, Variant
from xlapipe.ablation import results as store
from xlapipe.ablation.measure import MIN_STEADY, steady_state
from xlapipe.ablation.report import markdown, sentences
from xlapipe.ablation.stats import Interval, holm_levels, paired_interval, verdict
from xlapipe.ablation.variants import add_one

P = xp.Pipeline
WD, SS, MP, LD = xp.with_device(), xp.static_shapes(length=64), xp.wrap_model_mp(), xp.wrap_loader_mp()
EAGER = Variant("eager", P(), "extra reference row: eager PyTorch on the CPU, no XLA")
BASE = Variant("baseline", P(WD))
PLUS_SS = Variant("+static_shapes", P(WD, SS))
PLUS_MP = Variant("+wrap_model_mp", P(WD, SS, MP))
PLUS_LD = Variant("+wrap_loader_mp", P(WD, SS, MP, LD))


def _record(v: Variant, round_: int, status: str = "ok", device: str = "CPU", **report) -> dict:
    return {
        "format": store.FORMAT,
        "variant": v.name,
        "note": v.note,
        "pipeline_description": v.description,
        "repeat": round_,
        "status": status,
        "error": "" if status == "ok" else "Traceback ...\nRuntimeError: planted failure",
        "config": "c",
        "machine": {"host": "here", "node": None},
        "pjrt_device": device,
        "report": report if status == "ok" else {},
    }


def _table(truth: dict[str, float], rounds: int, noise: float, seed: int, fail=(), loss=None, variants=None):
    """Records of an add-one table whose true epoch times are ``truth``; a shared drift per round."""
    rng = random.Random(seed)
    variants = variants or [EAGER, BASE, PLUS_SS, PLUS_MP, PLUS_LD]
    records = []
    for r in range(1, rounds + 1):
        spell = math.exp(rng.gauss(0, 0.1))
        for v in variants:
            if v.name in fail:
                records.append(_record(v, r, status="error"))
                continue
            t = truth[v.name] * spell * math.exp(rng.gauss(0, noise))
            records.append(_record(v, r, epoch_s=t, final_loss=(loss or {}).get(v.name, 0.7), metric=0.5))
    return Results(
        variants, "baseline", records, Judging(repeats=rounds, until_resolved=False), mode="add-one"
    )


TRUTH = {
    "eager": 5.0,
    "baseline": 60.0,
    "+static_shapes": 20.0,
    "+wrap_model_mp": 20.0,
    "+wrap_loader_mp": 16.0,
}


def test_each_row_is_compared_with_the_row_before_and_the_baseline_second():
    res = _table(TRUTH, rounds=8, noise=0.01, seed=1)
    a = res.analysis()
    assert [s.previous for s in a.summaries] == [None, None, "baseline", "+static_shapes", "+wrap_model_mp"]
    assert a["+static_shapes"].increment.low > 2.5  # 3x over the baseline
    assert a["+wrap_model_mp"].increment_verdict.word == "no detectable difference"
    assert a["+wrap_loader_mp"].increment_verdict.word == "faster"
    assert a["+wrap_loader_mp"].increment.low < 1.25 < a["+wrap_loader_mp"].increment.high
    assert a["+wrap_loader_mp"].verdict.word == "faster"  # against the baseline: the second column
    assert a["+wrap_loader_mp"].interval.low > 3
    said = sentences(a)
    assert any(
        line.startswith("+wrap_loader_mp: 25% faster [") and "than +wrap_model_mp." in line for line in said
    )
    assert any(
        line.startswith("+wrap_model_mp: no detectable difference from +static_shapes") for line in said
    )
    md = markdown(a)
    head = md.splitlines()[2]
    assert head.index("against") < head.index("vs baseline")  # the increment is the first verdict


def test_a_failed_row_says_why_and_the_next_row_skips_it_and_says_so():
    res = _table(TRUTH, rounds=4, noise=0.01, seed=2, fail=("+wrap_model_mp",))
    a = res.analysis()
    assert a["+wrap_loader_mp"].previous == "+static_shapes"
    assert (
        "skips +wrap_model_mp (failed: RuntimeError: planted failure)" in a["+wrap_loader_mp"].increment_note
    )
    said = " ".join(sentences(a))
    assert "+wrap_model_mp: failed (RuntimeError: planted failure)" in said
    assert "(skips +wrap_model_mp (failed" in said
    assert "+wrap_loader_mp" not in a.unresolved and a["+wrap_loader_mp"].increment_verdict.word == "faster"


def test_leave_one_out_rows_are_compared_with_the_full_pipeline():
    full, less = Variant("full", P(WD, SS, MP)), Variant("-wrap_model_mp", P(WD, SS))
    truth = {"baseline": 60.0, "full": 20.0, "-wrap_model_mp": 20.0}
    rng = random.Random(3)
    records = [
        _record(v, r, epoch_s=truth[v.name] * math.exp(rng.gauss(0, 0.01)), final_loss=0.7)
        for r in range(1, 5)
        for v in (BASE, full, less)
    ]
    res = Results([BASE, full, less], "baseline", records, Judging(repeats=4), mode="leave-one-out")
    assert res["-wrap_model_mp"].previous == "full" and res["baseline"].previous == "full"
    assert res["full"].previous is None
    assert res["baseline"].increment_verdict.word == "slower"


def test_holm_steps_down_from_the_smallest_p_value():
    levels = holm_levels([0.001, 0.04, 0.012, None], 0.05)
    assert levels[0] == pytest.approx(1 - 0.05 / 4)  # first step: alpha / m (m counts the one without p)
    assert levels[2] == pytest.approx(1 - 0.05 / 3)  # 0.012 <= 0.0167: rejected at the second step
    assert levels[1] == pytest.approx(1 - 0.05 / 2)  # 0.04 > 0.025: stops here
    assert levels[3] == pytest.approx(1 - 0.05 / 2)  # the rest share the level where it stopped
    # an interval at its Holm level excludes 1 exactly when Holm rejects
    rng = random.Random(4)
    for _ in range(200):
        ref = [10 * math.exp(rng.gauss(0, 0.05)) for _ in range(5)]
        var = [r * math.exp(rng.gauss(0.03, 0.05)) for r in ref]
        iv = paired_interval(ref, var, 0.95)
        for alpha in (0.05, 0.0125, 0.005):
            at = iv.at(1 - alpha)
            assert (at.low > 1 or at.high < 1) == (iv.p_value < alpha)


def test_more_rows_compared_make_each_interval_wider():
    one = _table(TRUTH, rounds=5, noise=0.03, seed=5, variants=[BASE, PLUS_SS]).analysis()
    many = _table(TRUTH, rounds=5, noise=0.03, seed=5).analysis()
    assert many["+static_shapes"].increment.level > one["+static_shapes"].increment.level
    assert "Holm's step-down over the 3 increments" in markdown(many)


def test_a_resolution_is_read_from_both_sides():
    low_side = Interval(6, 0.98, 0.951, 1.01, 0.95, 0.02)  # 1/0.951 = 5.15% slower at worst
    assert low_side.resolution == pytest.approx(1 / 0.951 - 1)
    assert not verdict(low_side, 0.05).resolved
    assert verdict(Interval(6, 0.99, 0.953, 1.04, 0.95, 0.02), 0.05).resolved  # 4.9% and 4%


def test_an_undecided_row_says_what_it_could_detect_and_the_rounds_needed():
    res = _table({**TRUTH, "+wrap_model_mp": 19.4}, rounds=3, noise=0.04, seed=6)
    s = res["+wrap_model_mp"]
    assert not s.increment_verdict.resolved
    found, rounds = s.increment.detectable(), s.increment.rounds_to_decide(0.05)
    assert 0.05 < found < 2 and rounds > 3
    line = next(line for line in sentences(res.analysis()) if line.startswith("+wrap_model_mp"))
    assert "could detect" in line and f"about {rounds} paired rounds would decide ±5%" in line
    # more rounds of the same noise: the detectable effect shrinks
    longer = _table({**TRUTH, "+wrap_model_mp": 19.4}, rounds=12, noise=0.04, seed=6)["+wrap_model_mp"]
    assert longer.increment.detectable() < found


def test_an_aa_pair_is_a_row_against_its_twin_and_not_a_candidate():
    plan = add_one(P(WD, SS, MP)).with_twin()
    twin = plan.variants[-1]
    assert twin.name == "+wrap_model_mp (again)" and twin.pipeline == plan.variants[-2].pipeline
    variants = [BASE, PLUS_SS, PLUS_MP, Variant(twin.name, PLUS_MP.pipeline, twin.note)]
    truth = {**TRUTH, twin.name: TRUTH["+wrap_model_mp"]}
    res = _table(truth, rounds=6, noise=0.01, seed=7, variants=variants)
    s = res[twin.name]
    assert s.previous == "+wrap_model_mp" and s.increment_verdict.word == "no detectable difference"
    assert any(
        line.startswith(f"{twin.name} (A/A, the noise floor): no detectable difference")
        for line in sentences(res.analysis())
    )
    assert twin.name in dict(res.recommendation.excluded)


def test_a_row_that_changes_training_is_flagged_and_never_recommended():
    loss = {"+wrap_loader_mp": 0.9}  # the fastest row learns something else
    res = _table(TRUTH, rounds=5, noise=0.01, seed=8, loss=loss)
    s = res["+wrap_loader_mp"]
    assert s.training and "final loss 0.9 against 0.7 of +wrap_model_mp" in s.training[0]
    assert "CHANGES TRAINING" in markdown(res.analysis())
    assert res.recommendation.variant != "+wrap_loader_mp"
    assert dict(res.recommendation.excluded)["+wrap_loader_mp"].startswith("changes training")
    # a loss that differs within the runs' own spread is not flagged
    rng = random.Random(9)
    noisy = {name: 0.7 for name in TRUTH}
    res = _table(TRUTH, rounds=5, noise=0.01, seed=8, loss=noisy)
    records = [
        {**r, "report": {**r["report"], "final_loss": 0.7 + rng.uniform(-0.1, 0.1)}} for r in res.records
    ]
    res = Results(res.variants, "baseline", records, res.judging, mode="add-one")
    assert not any(s.training for s in res.summaries())


def test_eager_on_the_cpu_is_a_reference_row_never_the_answer():
    res = _table(TRUTH, rounds=5, noise=0.01, seed=10)  # eager is the fastest here (a CPU host)
    rec = res.recommendation
    assert rec.variant == "+wrap_loader_mp"
    assert "eager" in dict(rec.excluded) and "reference row" in dict(rec.excluded)["eager"]
    assert "this host's" in rec.reason and "TPU" in rec.reason


def test_the_fastest_of_a_higher_is_better_figure_is_the_highest():
    rng = random.Random(11)
    rate = {"baseline": 1.0, "+static_shapes": 3.0, "+wrap_model_mp": 2.0}
    variants = [BASE, PLUS_SS, PLUS_MP]
    records = [
        _record(v, r, steps_per_s=rate[v.name] * math.exp(rng.gauss(0, 0.01)), final_loss=0.7)
        for r in range(1, 6)
        for v in variants
    ]
    res = Results(variants, "baseline", records, Judging(figure="steps_per_s", repeats=5), mode="add-one")
    assert res.recommendation.variant == "+static_shapes"
    assert res["+wrap_model_mp"].increment_verdict.word == "slower"


def test_a_higher_metric_reads_as_better_not_slower():
    """``metric`` is higher-is-better like ``steps_per_s``: a row with the lower metric is the worse one."""
    rng = random.Random(12)
    metric = {"baseline": 0.5, "+static_shapes": 0.9, "+wrap_model_mp": 0.6}
    variants = [BASE, PLUS_SS, PLUS_MP]
    records = [
        _record(v, r, epoch_s=1.0, metric=metric[v.name] * math.exp(rng.gauss(0, 0.01)), final_loss=0.7)
        for r in range(1, 6)
        for v in variants
    ]
    res = Results(variants, "baseline", records, Judging(figure="metric", repeats=5), mode="add-one")
    assert res["+static_shapes"].increment_verdict.word == "faster"  # the better metric
    assert res["+wrap_model_mp"].increment_verdict.word == "slower"
    assert res["+static_shapes"].increment.low > 1.0


def test_the_warm_up_ends_where_the_compilations_stop():
    stamps = [float(i) for i in range(20)]
    compiles = [1, 2, 3] + [3] * 17  # steps 0-2 compile
    found = steady_state(stamps, compiles, [0], least=1)
    assert found.warmup == 3 and len(found.gaps) == 17 and not found.recompiles_throughout
    # a first evaluation's compilation later on does not move the warm-up
    late_eval = [1, 2] + [2] * 12 + [3] + [3] * 5
    assert steady_state(stamps, late_eval, [0], least=1).warmup == 2
    # a new graph every step: the recompilations are the steady state
    every = list(range(1, 21))
    found = steady_state(stamps, every, [0], least=3)
    assert found.recompiles_throughout and found.warmup == 3
    # off XLA: the least warm-up asked
    assert steady_state(stamps, None, [0], least=4).warmup == 4


def test_a_run_too_short_for_a_steady_state_says_the_steps_it_would_need():
    stamps = [float(i) for i in range(8)]
    compiles = [1, 2, 3, 4, 4, 4, 4, 4]
    found = steady_state(stamps, compiles, [0], least=1)
    assert found.too_short and f"at least {MIN_STEADY} steps after the warm-up" in found.too_short
    assert f"about {4 + MIN_STEADY} steps" in found.too_short


def test_old_results_are_read_as_the_previous_edition_or_refused_when_mixed(tmp_path):
    path = tmp_path / store.RESULTS_FILE
    old = []
    for r in range(1, 4):
        for v, t in ((BASE, 10.0), (PLUS_SS, 5.0 + r / 10)):
            record = _record(v, r, epoch_s=t, final_loss=0.7)
            for key in ("format", "machine", "pjrt_device"):
                del record[key]
            record["baseline"] = "baseline"
            old.append(record)
    for record in old:
        store.append(path, record)
    res = Results.load(tmp_path)
    assert any("previous edition" in n and "mean step" in n for n in res.notes)
    assert res["+static_shapes"].verdict.word == "faster"
    with pytest.raises(ValueError, match="previous edition.*another --out"):
        store.check_edition(old, path, resuming=True)
    store.append(path, {**_record(BASE, 4, epoch_s=10.0), "baseline": "baseline"})
    with pytest.raises(ValueError, match="results format 1, 2"):
        Results.load(tmp_path)
    newer = [{**_record(BASE, 1, epoch_s=1.0), "format": store.FORMAT + 1}]
    with pytest.raises(ValueError, match="newer xlapipe"):
        store.check_edition(newer, path, resuming=False)
    assert json.loads(path.read_text().splitlines()[-1])["format"] == store.FORMAT


def test_the_plot_has_a_panel_of_increments_when_rows_are_compared_with_one_another(tmp_path):
    import struct

    from xlapipe.ablation.report import plot

    res = _table(TRUTH, rounds=3, noise=0.01, seed=12)
    plot(res.analysis(), tmp_path / "add.png")
    flat = Results(res.variants, "baseline", res.records, res.judging, mode="explicit")
    plot(flat.analysis(), tmp_path / "flat.png")
    widths = [struct.unpack(">II", (tmp_path / f).read_bytes()[16:24])[0] for f in ("add.png", "flat.png")]
    assert widths[0] > widths[1] * 1.2, widths  # four panels against three


def test_the_noise_floor_is_in_the_report():
    from xlapipe.ablation.report import noise_note

    plan = add_one(P(WD, SS, MP)).with_twin()
    twin = plan.variants[-1]
    variants = [BASE, PLUS_SS, PLUS_MP, Variant(twin.name, PLUS_MP.pipeline, twin.note)]
    res = _table({**TRUTH, twin.name: 20.0}, rounds=4, noise=0.02, seed=13, variants=variants)
    records = [
        {**r, "report": {**r["report"], "step_s_rel_se": 0.02, "measured_steps": 9}} for r in res.records
    ]
    res = Results(res.variants, "baseline", records, res.judging, mode="add-one")
    note = noise_note(res.analysis())
    assert "median step of 9 measured steps is known to ±2%" in note and "about 36 steps" in note
    assert "pooled over the 4 rows compared (9 degrees of freedom)" in note
    assert "The A/A pair on its own (4 rounds)" in note and "more than chance" not in note
    assert note in markdown(res.analysis())
    # the twin's runs far noisier than the others': the report says the pooling does not hold
    noisy = [
        {
            **r,
            "report": {**r["report"], "epoch_s": r["report"]["epoch_s"] * (1.25 if r["repeat"] % 2 else 0.8)},
        }
        if r["variant"] == twin.name
        else r
        for r in records
    ]
    res = Results(res.variants, "baseline", noisy, res.judging, mode="add-one")
    assert "above the pooled figure by more than chance" in noise_note(res.analysis())


def test_the_csv_carries_the_increments(tmp_path):
    import csv

    from xlapipe.ablation.report import write_csv

    res = _table(TRUTH, rounds=4, noise=0.01, seed=14, loss={"+wrap_loader_mp": 0.9})
    write_csv(res.analysis(), tmp_path / "a.csv")
    rows = {r["variant"]: r for r in csv.DictReader(open(tmp_path / "a.csv"))}
    assert rows["+wrap_model_mp"]["compared_with"] == "+static_shapes"
    assert float(rows["+static_shapes"]["increment_low"]) > 2.5
    assert rows["baseline"]["compared_with"] == "" and rows["eager"]["increment_verdict"] == ""
    assert rows["+wrap_loader_mp"]["changes_training"].startswith("final loss 0.9")
