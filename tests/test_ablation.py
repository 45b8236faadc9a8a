"""The ablation command: variants per mode (pure), the results file, the reports, real runs."""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import struct
from pathlib import Path

import pytest

import xlapipe as xp
from xlapipe.ablation import (
    Judging,
    Output,
    Results,
    Runs,
    Stats,
    Variant,
    Variants,
    ablate,
    add_one,
    explicit,
    factorial,
    leave_one_out,
    plan,
    resolve_target,
    schedule,
)
from xlapipe.ablation import results as store
from xlapipe.ablation.progress import Clock, status
from xlapipe.ablation.report import write_all
from xlapipe.cli import main

WORKLOADS = Path(__file__).parent / "workloads"
SCRIPT = str(WORKLOADS / "tiny_mlp.py")
FAULTY = f"{WORKLOADS / 'faulty.py'}:train"
TINY_ARGS = ["--max-steps", "8", "--warmup", "1", "--train-size", "128", "--eval-size", "16"]

WD, WM, WL = xp.with_device(), xp.wrap_model_mp(), xp.wrap_loader_mp()
SDT, BF16 = xp.set_default_tensor_type(), xp.with_precision("bf16")
P = xp.Pipeline


def names(p) -> list[str]:
    return [v.name for v in p.variants]


# -- variants per mode: pure functions over Pipeline values ---------------------------


def test_leave_one_out_drops_dependents_and_says_so():
    full = P(WD, WM, WL, SDT, BF16)
    p = leave_one_out(full)
    assert names(p) == [
        "baseline",
        "full",
        "-with_device (and wrap_loader_mp, wrap_model_mp)",
        "-wrap_model_mp",
        "-wrap_loader_mp",
        "-set_default_tensor_type",
        "-with_precision",
    ]
    assert p.baseline == "baseline" and p["baseline"].pipeline == P()
    assert p["full"].pipeline == full
    assert p["-with_device (and wrap_loader_mp, wrap_model_mp)"].pipeline == P(SDT, BF16)
    assert p["-wrap_model_mp"].pipeline == P(WD, WL, SDT, BF16)
    assert p["-with_precision"].pipeline == P(WD, WM, WL, SDT)


def test_leave_one_out_follows_needs_of_parameterised_transforms():
    # a default tensor type on the XLA device and the XLA_USE_BF16 route both need with_device
    full = P(WD, xp.set_default_tensor_type(device="xla"), xp.with_precision("bf16", "env"))
    p = leave_one_out(full)
    assert "-with_device (and set_default_tensor_type, with_precision)" not in names(p)  # same as baseline
    assert "same pipeline as -with_device (and set_default_tensor_type, with_precision)" in p["baseline"].note
    assert names(p) == ["baseline", "full", "-set_default_tensor_type", "-with_precision"]


def test_leave_one_out_with_a_chosen_baseline_merges_equal_pipelines():
    p = leave_one_out(P(WD, WM), baseline=["with_device"])
    assert p["baseline"].pipeline == P(WD)
    assert names(p) == ["baseline", "full", "-with_device (and wrap_model_mp)"]
    assert "same pipeline as -wrap_model_mp" in p["baseline"].note


def test_add_one_is_cumulative_in_pipeline_order():
    full = P(WD, WM, WL, SDT)
    p = add_one(full)
    assert names(p) == [
        "baseline",
        "+with_device",
        "+wrap_model_mp",
        "+wrap_loader_mp",
        "+set_default_tensor_type",
    ]
    assert [v.pipeline for v in p.variants] == [P(), P(WD), P(WD, WM), P(WD, WM, WL), full]


def test_add_one_adds_unmet_needs_first_in_the_same_step():
    full = P(WD, WM, WL, SDT)
    p = add_one(full, order=["wrap_loader_mp", "set_default_tensor_type", "with_device", "wrap_model_mp"])
    assert names(p) == [
        "baseline",
        "+wrap_loader_mp (with with_device)",
        "+set_default_tensor_type",
        "+wrap_model_mp",
    ]
    assert p["+wrap_loader_mp (with with_device)"].pipeline == P(WD, WL)
    assert p["+wrap_model_mp"].pipeline == full


def test_add_one_independent_from_a_chosen_baseline():
    p = add_one(P(WD, WM, WL, SDT), baseline=["with_device"], cumulative=False)
    assert p["baseline"].pipeline == P(WD)
    assert [v.pipeline for v in p.variants[1:]] == [P(WD, WM), P(WD, WL), P(WD, SDT)]


def test_factorial_lists_refused_subsets():
    p = factorial(P(WD, WL, SDT))
    assert len(p.variants) == 6 and p.baseline == "none" and p["none"].pipeline == P()
    assert sorted(r.names for r in p.refused) == [
        ("wrap_loader_mp",),
        ("wrap_loader_mp", "set_default_tensor_type"),
    ]
    assert all("needs with_device" in r.reason for r in p.refused)
    assert p["with_device + wrap_loader_mp + set_default_tensor_type"].pipeline == P(WD, WL, SDT)


def test_factorial_keeps_non_factors_fixed():
    p = factorial(
        P(WD, WM, WL, BF16), factors=["wrap_model_mp", "wrap_loader_mp"], baseline=["wrap_loader_mp"]
    )
    assert len(p.variants) == 4 and not p.refused
    assert all({"with_device", "with_precision"} <= set(v.pipeline.names) for v in p.variants)
    assert p.baseline == "wrap_loader_mp" and p["wrap_loader_mp"].pipeline == P(WD, WL, BF16)


def test_explicit_variants_first_is_baseline():
    p = explicit([[], {"name": "fast", "pipeline": P(WD, WL).describe()}, P(WD)])
    assert names(p) == ["empty", "fast", "with_device"] and p.baseline == "empty"
    assert p["fast"].pipeline == P(WD, WL)
    assert p.with_baseline("fast").baseline == "fast"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plan("sideways", P(WD)), "unknown ablation mode 'sideways'"),
        (lambda: leave_one_out(P(WD, WL), baseline=["wrap_loader_mp"]), "needs with_device"),
        (lambda: factorial(P(WD, WL), factors=["wrap_model_mp"]), "wrap_model_mp is not in the pipeline"),
        (lambda: factorial(P(WD, WL), baseline=["wrap_loader_mp"]), "is refused"),
        (lambda: explicit([[], []]), "repeated: empty"),
        (lambda: explicit([{"steps": 3}]), "must be a pipeline description"),
        (lambda: explicit([[]]).with_baseline("nope"), "no variant 'nope'"),
        (lambda: plan("explicit", None), "needs variants"),
    ],
)
def test_bad_plans_are_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_repeats_are_round_robin():
    p = leave_one_out(P(WD, WL))
    order = [(r, v.name) for r, _, v in schedule(p, 2)]
    assert order == [
        (1, "baseline"),
        (1, "full"),
        (1, "-wrap_loader_mp"),
        (2, "baseline"),
        (2, "full"),
        (2, "-wrap_loader_mp"),
    ]


def test_targets_are_resolved_or_refused():
    assert resolve_target(SCRIPT, ["--max-steps", "2"]).kind == "script"
    assert resolve_target(SCRIPT, ["--max-steps", "2"], contract=True).kind == "contract"
    assert resolve_target("tiny_mlp:train", {"warmup": 1}).kwargs == {"warmup": 1}
    with pytest.raises(FileNotFoundError, match="no script 'missing.py'"):
        resolve_target("missing.py")
    with pytest.raises(ValueError, match="the runner sets"):
        resolve_target(SCRIPT, ["--report=x.json"], contract=True)
    assert resolve_target(SCRIPT, ["--report=x.json"]).args == ("--report=x.json",)  # unchanged: its own flag
    with pytest.raises(ValueError, match="keyword arguments"):
        resolve_target(SCRIPT, {"warmup": 1})
    with pytest.raises(ValueError, match="cannot be imported by a fresh process"):
        resolve_target(lambda pipeline: {})


# -- the results file and the reports (synthetic records, no runs) ----------------------


def _record(variant: Variant, repeat: int, status: str = "ok", **report) -> dict:
    return {
        "variant": variant.name,
        "pipeline_description": variant.description,
        "repeat": repeat,
        "status": status,
        "config": "c",
        "report": report if status == "ok" else None,
        "error": "" if status == "ok" else "Traceback...\nRuntimeError: boom",
    }


def test_results_file_is_append_only_and_survives_a_truncated_line(tmp_path):
    path = tmp_path / "results.jsonl"
    v = Variant("full", P(WD))
    store.append(path, _record(v, 1, epoch_s=1.0))
    store.append(path, _record(v, 2, epoch_s=float("nan")))
    with open(path, "a") as f:
        f.write('{"variant": "full", "repeat": 3, "sta')  # killed mid-write
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        assert [r["repeat"] for r in store.load(path)] == [1, 2]
    store.append(path, _record(v, 3, epoch_s=3.0))
    with pytest.warns(UserWarning):
        records = store.load(path)
    assert [r["repeat"] for r in records] == [1, 2, 3]
    assert records[1]["report"]["epoch_s"] is None  # NaN stored as strict JSON null


def test_stats_median_and_spread():
    s = Stats.of([4.0, 1.0, 10.0, 2.0, 3.0, float("nan")])
    assert (s.n, s.median, s.min, s.max, s.q1, s.q3) == (5, 3.0, 1.0, 10.0, 2.0, 4.0)
    assert Stats.of([None]) is None


def _synthetic(tmp_path) -> Results:
    base, fast, broken = Variant("baseline", P()), Variant("full", P(WD, WL)), Variant("-x", P(WD))
    records = [
        _record(base, 1, epoch_s=2.0, compiles_total=0, final_loss=0.5, metric=0.75),
        _record(fast, 1, epoch_s=1.0, compiles_total=3, final_loss=0.5, metric=0.75),
        _record(broken, 1, status="error"),
        _record(base, 2, epoch_s=2.2, compiles_total=0, final_loss=0.5, metric=0.75),
        _record(fast, 2, epoch_s=0.8, compiles_total=3, final_loss=0.5, metric=0.75),
        _record(broken, 2, status="timeout"),
    ]
    for i, r in enumerate(records):
        r.update(variant_index=i % 3, baseline="baseline", mode="leave-one-out")
        store.append(tmp_path / store.RESULTS_FILE, r)
    return Results([base, fast, broken], "baseline", records, mode="leave-one-out", out=str(tmp_path))


def test_summaries_compare_against_the_baseline(tmp_path):
    res = _synthetic(tmp_path)
    full = res["full"]
    assert full.figures["epoch_s"].median == pytest.approx(0.9)
    assert full.change_pct == pytest.approx(100 * (0.9 - 2.1) / 2.1)
    assert full.speedup_x == pytest.approx(2.1 / 0.9)
    assert res["-x"].runs == "0/2 ok, 1 error, 1 timeout" and not res.ok
    assert "-57.1%" in res.table() and "2.33x" in res.table()


def test_markdown_csv_and_png_are_written_and_parse(tmp_path):
    paths = write_all(_synthetic(tmp_path), tmp_path / "out")

    rows = list(csv.DictReader(open(paths["csv"])))
    assert [r["variant"] for r in rows] == ["baseline", "full", "-x"]
    assert float(rows[1]["speedup_x"]) == pytest.approx(2.1 / 0.9)
    assert float(rows[1]["epoch_s_min"]) == 0.8 and float(rows[1]["epoch_s_max"]) == 1.0
    assert rows[0]["is_baseline"] == "True" and rows[2]["runs_failed"] == "2"

    png = paths["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 600 and height >= 150

    lines = [ln for ln in paths["markdown"].read_text().splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    # leave-one-out: each row against the full pipeline first, then against the baseline
    assert cells[0][:7] == [
        "variant",
        "time / epoch (s) median [min-max]",
        "against",
        "speed-up [interval]",
        "verdict",
        "vs baseline",
        "speed-up",
    ]
    assert set(cells[1][0]) == {"-"} and len({len(c) for c in cells}) == 1
    table = {c[0]: c for c in cells[2:]}
    assert table["full"][1] == "0.9 [0.8-1]" and table["full"][5:7] == ["-57.1%", "2.33x"]
    assert table["baseline (baseline)" if "baseline (baseline)" in table else "baseline"][2] == "full"
    assert table["-x"][-1] == "0/2 ok, 1 error, 1 timeout"
    assert "RuntimeError: boom" in paths["markdown"].read_text()


def test_results_load_back_from_the_file(tmp_path):
    res = _synthetic(tmp_path)
    again = Results.load(tmp_path)
    assert [v.name for v in again.variants] == ["baseline", "full", "-x"]
    assert again["full"].speedup_x == pytest.approx(res["full"].speedup_x)


def test_results_load_reads_only_the_runs_made_with_the_latest_arguments(tmp_path):
    """One --out reused with other script arguments: the report is of the latest arguments' runs."""
    _synthetic(tmp_path)  # config "c"
    other = Variant("other-args-only", P(WD))
    later = _record(other, 1, epoch_s=5.0, compiles_total=0, final_loss=0.5, metric=0.75)
    later.update(config="d", variant_index=0, baseline="other-args-only", mode="leave-one-out")
    store.append(tmp_path / store.RESULTS_FILE, later)
    again = Results.load(tmp_path)
    assert [v.name for v in again.variants] == ["other-args-only"]


# -- real runs: fresh processes on the CPU runtime ------------------------------------


ONCE = Judging(repeats=1, until_resolved=False)


def test_contract_script_leave_one_out_writes_each_run_then_resumes(tmp_path):
    out = tmp_path / "abl"
    path = out / store.RESULTS_FILE
    seen: list[int] = []

    def echo(line: str) -> None:
        if "(round" in line:  # one line per finished run
            seen.append(len(store.load(path)))

    args = [*TINY_ARGS, "--no-model-mp", "--no-default-dtype"]  # full pipeline: with_device, wrap_loader_mp
    contract = Runs(contract=True, timeout=300)
    res = ablate(SCRIPT, args, judging=ONCE, runs=contract, output=Output(out, progress=False, echo=echo))
    assert [v.name for v in res.variants] == ["baseline", "full", "-wrap_loader_mp"]
    assert seen == [1, 2, 3]  # the file grew as each run finished
    first = path.read_text()
    records = store.load(path)
    assert [r["status"] for r in records] == ["ok"] * 3, [r["error"] for r in records]
    by = {r["variant"]: r for r in records}  # each round in its own random order
    full = by["full"]
    assert full["pipeline_description"] == P(WD, WL).describe() and "--pipeline" in full["command"]
    for key in (
        "epoch_s",
        "steps_per_s",
        "compiles_total",
        "compiles_after_warmup",
        "execute_s_after_warmup",
        "transfer_to_device_s_after_warmup",
        "peak_rss_mb",
        "final_loss",
        "metric",
    ):
        assert key in full["report"], key
    assert "compiles_total" not in by["baseline"]["report"]  # the empty pipeline is eager PyTorch
    assert res.ok and res["full"].speedup_x is not None
    assert all((out / f).stat().st_size > 0 for f in ("ablation.md", "ablation.csv", "ablation.png"))

    with open(path, "a") as f:
        f.write('{"variant": "full", "rep')  # a killed run's half line
    with pytest.warns(UserWarning, match="unreadable"):
        res = ablate(
            SCRIPT,
            args,
            variants=Variants(pipeline=P(WD, WL)),
            judging=Judging(repeats=2, until_resolved=False),
            runs=contract,
            output=Output(out, progress=False, echo=None),
        )
    text = path.read_text()
    assert text.startswith(first)  # nothing finished is lost or rewritten
    with pytest.warns(UserWarning):
        records = store.load(path)
    assert sorted((r["repeat"], r["variant"]) for r in records[3:]) == [
        (2, "-wrap_loader_mp"),
        (2, "baseline"),
        (2, "full"),
    ]
    assert sorted(r["position"] for r in records[3:]) == [0, 1, 2]
    assert res["full"].figures["epoch_s"].n == 2
    # a fresh interpreter and XLA runtime per run: each compiles its own graphs
    assert all(r["report"]["compiles_total"] >= 1 for r in records if r["variant"] != "baseline")
    assert len(list((out / "runs").glob("*/*.r[12].log"))) == 6  # one log per run, none overwritten


def test_a_failing_and_a_hanging_variant_are_recorded_and_the_rest_finish(tmp_path):
    variants = [
        {"name": "fine", "pipeline": []},
        {"name": "raises", "pipeline": P(SDT).describe()},
        {"name": "hangs", "pipeline": P(WD).describe()},
    ]
    kwargs = {"fail_if": "set_default_tensor_type", "hang_if": "with_device", "max_steps": 3, "warmup": 1}
    run = functools.partial(
        ablate,
        FAULTY,
        kwargs,
        variants=Variants(mode="explicit", explicit=variants),
        judging=ONCE,
        output=Output(tmp_path, progress=False, echo=None),
    )
    res = run(runs=Runs(timeout=30))
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert sorted((r["variant"], r["status"]) for r in records) == [
        ("fine", "ok"),
        ("hangs", "timeout"),
        ("raises", "error"),
    ]
    records = sorted(records, key=lambda r: ["fine", "raises", "hangs"].index(r["variant"]))
    assert "RuntimeError: deliberate failure" in records[1]["error"]
    assert records[2]["error"].startswith("timed out after 30 s")
    with pytest.raises(ProcessLookupError):
        os.kill(records[2]["pid"], 0)  # the hanging run was killed, not left behind
    assert records[0]["report"]["metric_name"] == "accuracy"
    assert not res.ok and res["hangs"].runs == "0/1 ok, 1 timeout (run > 30 s)"

    again = run(runs=Runs(timeout=30, retry_failed=False))
    assert len(store.load(tmp_path / store.RESULTS_FILE)) == 3  # nothing run again
    assert again["raises"].runs == "0/1 ok, 1 error"


def test_cli_ablate_and_report(tmp_path, capsys):
    out = str(tmp_path / "cli")
    variants = json.dumps([{"name": "eager", "pipeline": []}])
    code = main(
        [
            "ablate",
            SCRIPT,
            "--mode",
            "explicit",
            "--variants",
            variants,
            "--out",
            out,
            "--no-progress",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--",
            *TINY_ARGS,
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "eager (baseline)" in printed and "1/1 ok" in printed
    assert main(["report", out]) == 0
    assert "eager (baseline)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ablate", "no_such_script.py"], "no script"),
        (["ablate", SCRIPT, "--pipeline", '[{"name": "wrap_loader_mp"}]'], "needs with_device"),
        (
            ["ablate", SCRIPT, "--pipeline", "[]", "--mode", "factorial", "--factors", "with_device"],
            "not in the pipeline",
        ),
        (["ablate", SCRIPT, "--pipeline", "{not json"], "not valid JSON"),
        (["ablate", SCRIPT, "--import", "no_such_module_xyz"], "cannot import 'no_such_module_xyz'"),
        (["ablate", SCRIPT, "--contract", "--", "--report", "r.json"], "the runner sets"),
        (["ablate", SCRIPT, "--pipeline", "null"], "--pipeline must be a JSON list"),
        (["ablate", SCRIPT, "--pipeline", '"with_device"'], '[{"name": "with_device"}]'),
        (["ablate", SCRIPT, "--figure", "epoch_sec"], "unknown figure 'epoch_sec'"),
    ],
)
def test_cli_bad_input_says_what_is_wrong(argv, message, capsys, tmp_path):
    try:
        code = main([*argv, "--out", str(tmp_path)])
    except SystemExit as exit_:
        code, err = 2, str(exit_)
    else:
        err = capsys.readouterr().err
    assert code == 2 and message in err


def test_report_refuses_an_unknown_figure_before_it_deletes_anything(tmp_path, capsys):
    res = _synthetic(tmp_path)
    res.write(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert "recommended.json" in before
    assert main(["report", str(tmp_path), "--figure", "nosuch"]) == 2
    assert "unknown figure 'nosuch'; choose one of epoch_s" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert main(["report", str(tmp_path), "--figure", "compiles_total"]) == 0  # a figure the runs report


def test_progress_says_the_time_left_and_what_is_undecided():
    clock = Clock({"a": [60.0, 80.0], "b": [30.0]})
    assert clock.typical("a") == 70 and clock.typical("not run yet") == 60  # the median of every run
    assert clock.total(["a", "b"]) == 100 and Clock({}).total(["a"]) is None
    assert status(400, 900, ["x", "y"]) == "about 7 min left (at most 15 min); undecided: x, y"
    assert status(400, 900, ["x"], budget=300) == "about 5 min left (the budget); undecided: x"
    assert status(None, None, list("abcde")) == "about ? left; undecided: a, b, c and 2 more"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("report", "oops", "'report' is 'oops', not the run's figures"),
        ("repeat", "one", "'repeat' is 'one', not a round number"),
        ("epoch_s", 0, r"report\['epoch_s'\] is 0: a time or a rate is a positive number"),
        ("epoch_s", -3, r"report\['epoch_s'\] is -3: a time or a rate is a positive number"),
        ("variant", 7, "'variant' is 7, not a variant's name"),
    ],
)
def test_report_on_a_damaged_record_names_the_file_the_line_and_the_field(
    tmp_path, capsys, field, value, message
):
    res = _synthetic(tmp_path)
    res.write(tmp_path)
    path = tmp_path / store.RESULTS_FILE
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if isinstance(json.loads(line).get("report"), dict))
    record = json.loads(lines[at])
    if field == "epoch_s":
        record["report"]["epoch_s"] = value
    else:
        record[field] = value
    lines[at] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(path))}, line {at + 1}: {message}", err), err
    assert "correct that line or remove it" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before  # nothing rewritten
