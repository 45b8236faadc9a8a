"""The example workloads: flags, the pipeline they select, end-to-end runs and reports."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
NLP = os.path.join(EXAMPLES, "nlp_example.py")
CV = os.path.join(EXAMPLES, "cv_example.py")
ALL_OFF = ["--without", "with_device", "--without", "set_default_tensor_type"]
DEFAULT = [
    "with_device",
    "wrap_model_mp",
    "hf_traced_masks",
    "static_shapes",
    "wrap_loader_mp",
    "set_default_tensor_type",
]
TEXT_ONLY = {"hf_traced_masks", "static_shapes"}
# What the workload-script contract promises in every report (on top of the Meter's keys).
CONTRACT = {
    "epoch_s",
    "epoch_s_extrapolated",
    "final_loss",
    "metric",
    "metric_name",
    "pipeline",
    "pipeline_description",
    "steps",
    "steps_per_s",
    "wall_s",
    "compiles_total",
    "compiles_after_warmup",
    "execute_s_after_warmup",
    "peak_rss_mb",
}


def script_env():
    env = {k: v for k, v in os.environ.items() if k != "CPU_NUM_DEVICES"}
    env["PJRT_DEVICE"] = "CPU"
    # Two cores shared with other work: OpenMP threads waiting at barriers for a
    # descheduled sibling made eager CPU steps up to 100x slower. One thread is steady.
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(script, *flags, expect_ok=True):
    proc = subprocess.run(
        [sys.executable, script, *flags],
        capture_output=True,
        text=True,
        timeout=240,
        env=script_env(),
        cwd=ROOT,
    )
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def report_of(script, tmp_path, *flags):
    path = tmp_path / "report.json"
    proc = run(script, *flags, "--report", str(path))
    report = json.loads(path.read_text())
    assert report["pipeline"] in proc.stdout  # the pipeline in use is printed
    return report


def check_report(report, steps):
    assert CONTRACT <= set(report), CONTRACT - set(report)
    assert report["steps"] == steps
    assert math.isfinite(report["final_loss"]) and report["final_loss"] > 0
    assert report["metric_name"] == "accuracy" and 0.0 <= report["metric"] <= 1.0
    assert report["epoch_s"] > 0 and report["steps_per_s"] > 0
    assert report["compiles_total"] >= report["compiles_after_warmup"] >= 0


# -- end to end, in fresh processes -------------------------------------------------------------


@pytest.mark.slow
def test_nlp_default_pipeline(tmp_path):
    report = report_of(
        NLP,
        tmp_path,
        "--size",
        "tiny",
        "--epochs",
        "2",
        "--warmup",
        "3",
        "--train-size",
        "64",
        "--eval-size",
        "32",
    )
    check_report(report, steps=8)
    assert [t["name"] for t in report["pipeline_description"]] == DEFAULT
    assert report["device"].startswith("xla")
    assert report["compiles_total"] >= 1
    assert report["compiles_after_warmup"] == 0  # fixed shapes: nothing new after warm-up
    assert report["epoch_s_extrapolated"] is False  # epoch 2 ran whole, after warm-up
    assert report["steps_per_epoch"] == 4


@pytest.mark.slow
def test_nlp_every_practice_off(tmp_path):
    report = report_of(
        NLP,
        tmp_path,
        *ALL_OFF,
        "--without",
        "static_shapes",
        "--size",
        "tiny",
        "--epochs",
        "1",
        "--max-steps",
        "6",
        "--warmup",
        "2",
        "--eval-size",
        "32",
    )
    check_report(report, steps=6)
    assert report["pipeline_description"] == [] and report["pipeline"] == "Pipeline: (identity)"
    assert report["device"] == "cpu" and report["compiles_total"] == 0
    assert report["epoch_s_extrapolated"] is True  # cut short by --max-steps


@pytest.mark.slow
def test_cv_default_pipeline(tmp_path):
    report = report_of(
        CV,
        tmp_path,
        "--size",
        "tiny",
        "--epochs",
        "2",
        "--max-steps",
        "4",
        "--warmup",
        "3",
        "--train-size",
        "256",
        "--eval-size",
        "64",
    )
    check_report(report, steps=8)
    assert [t["name"] for t in report["pipeline_description"]] == [n for n in DEFAULT if n not in TEXT_ONLY]
    assert report["device"].startswith("xla") and report["compiles_total"] >= 1
    assert report["compiles_after_warmup"] == 0
    assert report["epoch_s_extrapolated"] is True


@pytest.mark.slow
def test_cv_every_practice_off(tmp_path):
    report = report_of(
        CV,
        tmp_path,
        *ALL_OFF,
        "--size",
        "tiny",
        "--epochs",
        "1",
        "--max-steps",
        "5",
        "--warmup",
        "2",
        "--eval-size",
        "64",
    )
    check_report(report, steps=5)
    assert report["pipeline_description"] == [] and report["device"] == "cpu"
    assert report["compiles_total"] == 0


@pytest.mark.slow
@pytest.mark.long  # 460 eager steps; the examples' own tests train the task on the device in CI
def test_the_synthetic_pair_task_is_learnable(tmp_path):
    # Two epochs of the MRPC-sized task (460 steps), eagerly on the CPU (padded
    # to the longest pair, the quickest way there): the tiny BERT, from random
    # weights, ends far above chance (0.5). Seeds 0 to 3 gave 0.92 to 1.0.
    report = report_of(
        NLP,
        tmp_path,
        "--size",
        "tiny",
        "--epochs",
        "2",
        "--without",
        "with_device",
        "--without",
        "static_shapes",
    )
    assert report["metric"] >= 0.75, report["metric"]


@pytest.mark.slow
def test_print_pipeline_and_bad_pipelines():
    proc = run(
        NLP,
        "--print-pipeline",
        "--without",
        "wrap_model_mp",
        "--with",
        'static_shapes{"buckets": [32, 64, 128]}',
    )
    description = json.loads(proc.stdout.strip().splitlines()[-1])
    names = [t["name"] for t in description]
    assert names == [
        "with_device",
        "hf_traced_masks",
        "static_shapes",
        "wrap_loader_mp",
        "set_default_tensor_type",
    ]
    assert description[2]["params"]["buckets"] == [32, 64, 128]
    proc = run(CV, "--pipeline", '[{"name": "no_such_practice"}]', expect_ok=False)
    assert proc.returncode != 0 and "unknown transform 'no_such_practice'" in proc.stderr


# -- the pipeline the flags select (in this process) ---------------------------------------------


@pytest.fixture
def nlp(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the example sets these; keep this process as it was
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.syspath_prepend(EXAMPLES)
    import _common
    import nlp_example

    def select(*flags):
        return _common.select_pipeline(nlp_example.WORKLOAD, _common.parse(nlp_example.WORKLOAD, list(flags)))

    return select


def test_cpu_defaults(nlp):
    pipeline = nlp()
    assert pipeline.names == tuple(DEFAULT)  # fp32 on the CPU runtime: no with_precision
    assert dict(pipeline["static_shapes"].params)["length"] == 128


@pytest.mark.parametrize(
    "name, gone",
    [
        ("wrap_model_mp", {"wrap_model_mp"}),
        ("wrap_loader_mp", {"wrap_loader_mp"}),
        ("set_default_tensor_type", {"set_default_tensor_type"}),
        ("static_shapes", {"static_shapes"}),
        ("hf_traced_masks", {"hf_traced_masks"}),
        ("with_device", {"with_device", "wrap_model_mp", "hf_traced_masks", "wrap_loader_mp"}),
    ],
)
def test_without_drops_a_practice_and_what_needs_it(nlp, name, gone):
    assert set(nlp().names) - set(nlp("--without", name).names) == gone


def test_with_adds_or_replaces_any_registered_transform(nlp):
    shapes = dict(
        nlp("--with", 'static_shapes{"buckets": [128, 32, 64], "drop_last": ["train"]}')[
            "static_shapes"
        ].params
    )
    assert shapes["buckets"] == (32, 64, 128) and shapes["drop_last"] == ("train",)
    assert nlp("--with", "with_precision").names == (
        *DEFAULT,
        "with_precision",
    )  # added where relations allow: last
    pipeline = nlp("--with", 'compile_step{"optimizer": false}', "--with", 'recompile_guard{"warmup": 7}')
    assert pipeline.names == (*DEFAULT, "compile_step", "recompile_guard")
    assert dict(pipeline["compile_step"].params)["optimizer"] is False
    # applied in the order given: a transform added after what it needs is dropped is refused
    with pytest.raises(SystemExit, match="compile_step needs with_device"):
        nlp("--without", "with_device", "--with", "compile_step")
    assert "compile_step" not in nlp("--with", "compile_step", "--without", "with_device").names


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--with", "compile_step{optimizer: false}"), "not valid JSON"),
        (("--with", "compile_step[1]"), "--with takes NAME or 'NAME{json params}'"),
        (("--with", "no_such_practice"), "unknown transform 'no_such_practice'"),
        (("--with", 'compile_step{"backend": "inductor"}'), "backend 'inductor' is not supported"),
        (("--without", "compile_step"), "--without compile_step: no such transform"),
        (("--import", "no_such_module_here"), "--import no_such_module_here"),
    ],
)
def test_bad_changes_are_refused_clearly(nlp, flags, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        nlp(*flags)


def test_training_shorthands_add_their_transforms(nlp):
    pipeline = nlp("--accumulate", "4", "--max-grad-norm", "1.0", "--log-every", "10")
    assert pipeline.names == (*DEFAULT, "accumulate_grad", "clip_grad_norm", "log_every")
    assert dict(pipeline["accumulate_grad"].params) == {"steps": 4, "last_window": "average"}
    assert dict(pipeline["clip_grad_norm"].params)["max_norm"] == 1.0
    with pytest.raises(SystemExit):
        nlp("--accumulate", "0")


def test_a_users_own_transform_is_switched_from_the_command_line(nlp, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tests", "workloads"))
    pipeline = nlp("--import", "my_practice", "--with", 'count_steps{"label": "mine"}')
    assert pipeline.names[-1] == "count_steps" and dict(pipeline["count_steps"].params) == {"label": "mine"}


def test_pipeline_json_replaces_the_flags(nlp):
    pipeline = nlp(
        "--pipeline", '[{"name": "with_device"}, {"name": "static_shapes", "params": {"length": 64}}]'
    )
    assert pipeline.names == ("with_device", "static_shapes")
    with pytest.raises(SystemExit, match="not valid JSON"):
        nlp("--pipeline", "not json")
    with pytest.raises(SystemExit, match="must be an object"):
        nlp("--pipeline", '[{"name": "with_device", "params": null}]')


def test_presets_fill_what_the_flags_leave(monkeypatch, nlp):
    import _common
    import nlp_example

    args = _common.parse(nlp_example.WORKLOAD, ["--size", "base"])
    assert (args.lr, args.batch_size, args.train_size, args.eval_size) == (2e-5, 16, 3668, 408)
    assert nlp_example.MODELS["base"]["vocab_size"] == 28996
    args = _common.parse(nlp_example.WORKLOAD, ["--lr", "1e-4"])
    assert args.size == "small" and args.lr == 1e-4


def test_generated_pairs_are_deterministic_and_mrpc_shaped(nlp):
    import nlp_example

    pairs = nlp_example.make_pairs(3668, seed=0)
    assert pairs == nlp_example.make_pairs(3668, seed=0) and pairs != nlp_example.make_pairs(3668, seed=1)
    lengths = [len(ids) for ids, _, _ in pairs]
    assert 15 <= min(lengths) and max(lengths) <= 110 and max(lengths) - min(lengths) > 70
    assert 0.45 < sum(label for _, _, label in pairs) / len(pairs) < 0.55
    ids, types, _ = pairs[0]
    assert ids[0] == nlp_example.CLS and ids[-1] == nlp_example.SEP and len(types) == len(ids)


@pytest.mark.slow
def test_the_ported_accelerate_example_trains_with_accumulation_and_evaluates_each_epoch():
    proc = run(
        os.path.join(EXAMPLES, "accelerate_nlp_example.py"),
        "--size",
        "tiny",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--train-size",
        "128",
        "--eval-size",
        "64",
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1"]
    assert all(0.0 <= float(line.rsplit(" ", 1)[1].rstrip("}")) <= 1.0 for line in lines)


def test_the_porting_page_shows_the_ported_example_as_it_is():
    with open(os.path.join(ROOT, "docs", "porting.md")) as f:
        page = f.read()
    with open(os.path.join(EXAMPLES, "accelerate_nlp_example.py")) as f:
        script = f.read()
    shown = page.split("The same with xlapipe")[1].split("```python\n")[1].split("```")[0]
    assert shown.strip() and textwrap.indent(shown, "    ") in script, (
        "docs/porting.md and the example differ"
    )
