"""The benchmark suite runs end to end and writes outputs that parse (no speed assertions)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import run as bench_run  # noqa: E402
from bench.decide import makefile_words  # noqa: E402


def tables(markdown: str) -> list[list[list[str]]]:
    """Every Markdown table as rows of cells."""
    found, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [
        sys.executable,
        "-m",
        "bench.run",
        "--size",
        "smoke",
        "--workloads",
        "bert,hostbound,overhead",
        # the smoke BERT has no dropout, which compile_step refuses on torch_xla 2.9 (tested there)
        "--skip-peers",
        "xlapipe+compile_fwd,torch_xla,eager,accelerate,bert:xlapipe+compile,"
        "bert:xlapipe+xla_compile,xlapipe+bpe4,xlapipe+acc4",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.long  # seven runs of the bench in fresh processes; its figures' arithmetic is tested below
def test_smoke_run_writes_json_and_markdown_that_parse(smoke):
    with open(smoke / "results.json") as f:
        result = json.load(f)
    runs = result["runs"]
    assert {(r["workload"], r["peer"]) for r in runs} == {
        ("bert", "xlapipe"),
        ("bert", "xlapipe-no-hf-masks"),
        ("hostbound", "xlapipe"),
        ("hostbound", "xlapipe+compile"),
        ("hostbound", "xlapipe+xla_compile"),
        ("hostbound", "xlapipe+acc4+bpe4"),
        ("overhead", "xlapipe"),
    }
    assert all(r["status"] == "ok" for r in runs), [r.get("error") for r in runs]
    for r in runs:
        if r["workload"] != "overhead":
            assert r["measured_steps"] == (3 if r["workload"] == "bert" else 20), r
            assert r["compiles_total"] >= 1 and r["steps_per_s"] > 0 and len(r["losses"]) == r["steps"]
    bert = result["summary"]["bert"]
    # without hf_traced_masks transformers reads the mask on the host: one more execution per step
    executions = {p: bert[p]["executions_per_step"]["median"] for p in ("xlapipe", "xlapipe-no-hf-masks")}
    assert executions["xlapipe-no-hf-masks"] >= executions["xlapipe"] + 0.9, executions
    hb = result["summary"]["hostbound"]
    # identical work: the compiled step computes the lazy step's losses
    assert hb["xlapipe+compile"]["loss_max_rel_diff_vs_xlapipe"] <= 1e-5
    assert hb["xlapipe+xla_compile"]["loss_max_rel_diff_vs_xlapipe"] == 0  # the same lazy graph, in a region
    # a graph per update (20 steps, 4 micro-batches each), give or take the warm-up's last window
    # finishing after the count began (executions are counted as they complete)
    assert hb["xlapipe+acc4+bpe4"]["executions_per_step"]["median"] * 20 <= 20 / 4 + 1 + 1e-9
    assert all(r["first_update_s"] > 0 for r in runs if r["workload"] != "overhead")
    assert hb["xlapipe"]["xlapipe_over_peer_steps_per_s"]["median"] == pytest.approx(1.0)
    names = [t["target"] for t in result["targets"]]
    assert any(n.startswith("hostbound: compile_step") for n in names)
    assert any(n.startswith("overhead") for n in names)

    markdown = (smoke / "results.md").read_text()
    assert markdown.startswith("# xlapipe against its peers")
    found = tables(markdown)
    assert len(found) >= 4  # targets, bert, hostbound, overhead
    for table in found:
        assert set(table[1][0]) <= set("-:")  # the separator row
        assert all(len(row) == len(table[0]) for row in table), table
    assert os.listdir(smoke / "logs")


def run(workload, peer, repeat, **figures):
    return {"workload": workload, "peer": peer, "repeat": repeat, "status": "ok", **figures}


def test_ratios_are_paired_by_repeat_and_point_the_stated_way():
    runs = [
        run("bert", "xlapipe", 0, steps_per_s=2.0, losses=[1.0]),
        run("bert", "accelerate", 0, steps_per_s=1.0, losses=[1.0]),
        run("bert", "xlapipe", 1, steps_per_s=4.0, losses=[1.0]),
        run("bert", "accelerate", 1, steps_per_s=1.0, losses=[1.1]),
        run("varlen", "xlapipe", 0, epoch_s=10.0, losses=[]),
        run("varlen", "accelerate", 0, epoch_s=30.0, losses=[]),
    ]
    for r in runs:
        r.update(loop="x", compiles_after_warmup=0.0)
    summary = bench_run.summarise(runs)
    ratio = summary["bert"]["accelerate"]["xlapipe_over_peer_steps_per_s"]
    assert (ratio["median"], ratio["min"], ratio["max"]) == (3.0, 2.0, 4.0)
    assert summary["bert"]["accelerate"]["loss_max_rel_diff_vs_xlapipe"] == pytest.approx(0.1)
    assert summary["varlen"]["accelerate"]["peer_over_xlapipe_epoch_s"]["median"] == 3.0
    met = {t["target"]: t["met"] for t in bench_run.targets(summary, runs)}
    assert met["bert: xlapipe steps/s / Accelerate steps/s"] is True
    assert met["varlen: Accelerate epoch time / xlapipe epoch time"] is True
    assert met["varlen: xlapipe compilations after warm-up (max over repeats)"] is True


def memory_run(config, parent, replica, host_extra):
    phases = {
        phase: {
            "processes": {
                "parent": {"Pss": parent},
                **{f"replica{i}": {"Pss": replica + extra} for i in range(2)},
            }
        }
        for phase, extra in (("runtime", 0.0), ("host", host_extra), ("realised", host_extra))
    }
    totals = {phase: sum(p["Pss"] for p in f["processes"].values()) for phase, f in phases.items()}
    return run("memory", config, 0, phases=phases, total_pss_mb=totals, device_copies_mb=0.0, pipeline="p")


def test_memory_ratios_with_and_without_the_parents_share(tmp_path):
    runs = [memory_run("replica_builds", 300.0, 50.0, 400.0), memory_run("wrap_model_mp", 400.0, 100.0, 0.0)]
    summary = bench_run.summarise(runs)
    row = summary["memory"]["wrap_model_mp"]
    assert row["ratio_vs_replica_builds_host"]["median"] == pytest.approx(600 / 1200)
    assert row["replicas_ratio_vs_replica_builds_host"]["median"] == pytest.approx(200 / 900)
    # --render recomputes both from a results.json's runs
    env = {
        "cpus": 2,
        "machine": "m",
        "python": "3",
        "versions": {},
        "commit": "c",
        "pjrt_device": "CPU",
        "load_before": "0",
        "load_after": "0",
    }
    (tmp_path / "results.json").write_text(
        json.dumps(
            {
                "runs": runs,
                "environment": env,
                "command": "c",
                "date": "d",
                "size": "s",
                "repeats": 1,
                "suite_s": 1,
            }
        )
    )
    assert bench_run.main(["--render", str(tmp_path)]) == 0
    rendered = json.loads((tmp_path / "results.json").read_text())
    assert rendered["summary"]["memory"]["wrap_model_mp"] == json.loads(json.dumps(row))
    assert "replicas only" in (tmp_path / "results.md").read_text()


def test_smaps_reads_this_process():
    from bench.memory import smaps

    mine = smaps(os.getpid())
    assert mine["Rss"] > 10 and 0 < mine["Pss"] <= mine["Rss"] + 1


def test_decide_bench_runs_the_makefiles_main_job_and_todays_runner_on_the_same_work():
    from bench import decide

    new, old = decide.command("new", "OUT"), decide.command("old", "OUT")
    split = new.index("--")
    assert new[split + 1 :] == old[old.index("--") + 1 :] == makefile_words("ABLATE_ARGS")
    assert " ".join(makefile_words("ABLATE_PLAN")) in " ".join(new) and " ".join(
        makefile_words("ABLATE_PLAN")
    ) in " ".join(old)
    assert " ".join(makefile_words("ABLATE_OPTS")) in " ".join(new[:split])
    assert old[old.index("--repeats") + 1] == "6" and "--budget" not in old
    table = decide.markdown(
        {
            "environment": bench_run.environment(),
            "ablations": [
                {"runner": "old", "command": ["x"], "runs": 42, "wall_s": 3600.0,
                 "verdicts": {"baseline": "", "+a": "faster (2.9x-3.3x)", "+b": "undecided"}, "table": "T1"},
                {"runner": "new", "command": ["y"], "runs": 21, "wall_s": 1200.0,
                 "verdicts": {"baseline": "", "+a": "faster (2.5x-3.6x)", "+b": "slower (0.5x-0.9x)"},
                 "table": "T2"},
            ],
        }
    )  # fmt: skip
    assert "| +a | faster (2.9x-3.3x) | faster (2.5x-3.6x) | yes |" in table
    assert "| +b | undecided | slower (0.5x-0.9x) | **no** |" in table
    assert "60.0 min" in table and "20.0 min" in table


def test_decide_bench_takes_the_new_table_from_a_finished_make_ablate(tmp_path):
    from bench import decide

    done = tmp_path / "nlp-ablation"
    done.mkdir()
    (done / "ablation.csv").write_text(
        "variant,runs_ok,runs_failed,verdict\nbaseline,3,0,reference\n+a,3,0,faster (2.5x-3.6x)\n+b,2,1,undecided\n"
    )
    (done / "ablation.md").write_text("# Ablation\n\n| T |\n\n## Phases\n\nnot the table\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit):  # a folder without its wall time is refused
        decide.main(["--only", "old", "--new-from", str(done), "--out", str(out)])
    found = decide.collected("new", str(done), ["make", "ablate"], 849.0, None)
    assert found["runs"] == 9 and found["wall_s"] == 849.0
    assert found["verdicts"] == {"baseline": "reference", "+a": "faster (2.5x-3.6x)", "+b": "undecided"}
    assert found["table"].strip() == "# Ablation\n\n| T |"


def test_doctor_cost_pairs_each_script_with_its_plain_run_and_names_the_unmeasured():
    from bench import doctor_cost

    def run(script: str, repeat: int, plain_s: float, script_s: float | None, wall_s: float) -> dict:
        ok = script_s is not None
        return {
            "script": script,
            "repeat": repeat,
            "plain": {"status": "ended", "wall_s": plain_s},
            "doctor": {
                "wall_s": wall_s,
                "script_s": script_s,
                "outside_s": None if script_s is None else wall_s - script_s,
            },
            "ratio": script_s / plain_s if ok else None,
        }

    runs = [
        run("a.py", 0, 10.0, 12.0, 18.0),  # 1.2x, 6 s outside
        run("a.py", 1, 10.0, 16.0, 20.0),  # 1.6x, 4 s outside: a.py's medians 1.4x and 5 s
        run("b.py", 0, 5.0, 10.0, 21.0),  # 2.0x, 11 s outside
        run("c.py", 0, 5.0, None, 30.0),  # the doctor wrote no diagnosis
    ]
    s = doctor_cost.summarise(runs)
    assert s["scripts"]["a.py"]["ratio"] == pytest.approx(1.4)
    assert s["scripts"]["a.py"]["outside_s"] == pytest.approx(5.0)
    assert s["ratio_median"] == pytest.approx(1.7) and s["ratio_worst"] == pytest.approx(2.0)
    assert s["outside_s_worst"] == pytest.approx(11.0) and s["unmeasured"] == ["c.py"]
    text = doctor_cost.markdown(s, "cmd", {"date": "d", "cpus": 2, "python": "3.11"})
    assert "| a.py | 10.0 | 14.0 | 1.40x | 5.0 |" in text and "| c.py | not measured" in text
    assert "worst 2.00x (target: at most 1.5x)" in text
    assert "hang.py" not in doctor_cost.corpus() and "clean_plain.py" in doctor_cost.corpus()
    with pytest.raises(SystemExit, match="no script nope.py"):
        doctor_cost.corpus(["nope.py"])


def test_noise_bench_rounds_give_the_power_they_promise():
    """The rounds bench.noise asks for detect the effect 80% of the time at Holm's strictest level."""
    import math
    import random
    import statistics

    from bench import noise

    sd, effect = 0.06, 0.10
    n = math.ceil(noise.rounds_needed(sd, effect))
    assert 8 <= n <= 12  # (2.58 + 0.84)^2 * 2 * 0.06^2 / ln(1.1)^2 = 9.3
    crit = statistics.NormalDist().inv_cdf(1 - 0.05 / noise.INCREMENTS / 2)
    rng = random.Random(0)
    trials = 3000
    seen = 0
    for _ in range(trials):  # each round: two runs, each with its own noise, the second `effect` slower
        diffs = [math.log(1 + effect) + rng.gauss(0, sd) - rng.gauss(0, sd) for _ in range(n)]
        z = statistics.fmean(diffs) / (math.sqrt(2) * sd / math.sqrt(n))
        seen += z > crit
    assert 0.8 <= seen / trials <= 0.9  # at least the power asked; n - 1 rounds would fall short
    assert noise.rounds_needed(sd, 0.05) > 3.5 * noise.rounds_needed(sd, 0.10)


def test_noise_bench_block_spread_and_drift_figures():
    from bench import noise

    assert noise.block_spread([0.5] * 30, 6) == 0.0
    steps = [0.5] * 6 + [0.6] * 6 + [0.5] * 6 + [0.6] * 6  # blocks alternate by 20%
    assert abs(noise.block_spread(steps, 6) - 0.105) < 0.01  # sd of (ln .5, ln .6, ln .5, ln .6)
    assert noise.block_spread(steps, 12) is None  # two blocks only: no spread
    assert noise.autocorrelation([float(i) for i in range(20)]) > 0.8  # a drift
    assert noise.autocorrelation([(-1.0) ** i for i in range(20)]) < -0.8
    run = {"step_times_s": steps * 4, "fixed_s": 20.0, "warmup_steps": 3, "step_s": 0.55}
    rows = noise.plan(run, [6, 12, 1000])
    assert [r["block"] for r in rows] == [6, 12]  # a block longer than the run is left out
    assert rows[0]["rounds_0.05"] > rows[0]["rounds_0.1"] and rows[0]["minutes_0.05"] > rows[0]["minutes_0.1"]
    assert rows[1]["run_sd"] == 0.0 and rows[1]["rounds_0.05"] == 2  # 12-step blocks all alike: the least
    assert rows[0]["run_s"] == 20.0 + (6 + 3 + 1) * 0.55


def test_kernel_cost_variants_install_what_they_say_and_leave_nothing_behind():
    from bench import kernel_cost
    from xlapipe import kernel_fixes

    def installed() -> float:
        seen.append(set(kernel_fixes._installed))
        return 0.0

    seen: list[set[str]] = []
    for variant in kernel_cost.VARIANTS:
        kernel_cost._fixed(variant, installed)
    own, without_wrappers, with_device = seen
    assert own == set() and "amax" in without_wrappers and "amax" in with_device
    wrapped = {
        *kernel_fixes.EMPTY_DIM_OPS,
        *kernel_fixes.DIAGONAL_OPS,
        *kernel_fixes.UPSAMPLE_OPS,
        *kernel_fixes.SVD_OPS,
    }
    assert not wrapped & without_wrappers and wrapped <= with_device
    assert with_device - without_wrappers == wrapped
    assert kernel_fixes._installed == {}  # each variant restored torch_xla's kernels
