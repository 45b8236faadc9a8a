"""xlapipe doctor on real scripts, each run in a fresh process on the CPU runtime.

The planted-fault scripts (tests/doctor_scripts/) mark each fault's line with
``# FAULT: kind``: the doctor must find exactly those, at those lines, and
nothing else; clean scripts (and the BERT example) must give no finding.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import xlapipe as xp
from xlapipe.cli import main
from xlapipe.doctor import child
from xlapipe.doctor.diagnose import Diagnosis, _diagnose, diagnose
from xlapipe.doctor.events import trace_files
from xlapipe.doctor.findings import seconds
from xlapipe.doctor.report import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "doctor_scripts")
NLP = os.path.join(ROOT, "examples", "nlp_example.py")
NLP_TINY = ["--size", "tiny", "--epochs", "1", "--max-steps", "12"]


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def marked(name: str, tag: str) -> list[tuple[str, int]]:
    """(what, line) of every ``# TAG: what[, what]`` comment in the script."""
    with open(script(name)) as f:
        return [
            (what.strip() if m.group(1) else None, i)
            for i, line in enumerate(f, 1)
            if (m := re.search(rf"# {tag}(?:: ([\w, ]+))?", line)) is not None
            for what in (m.group(1) or "-").split(",")
        ]


def found(d: Diagnosis, name: str) -> set[tuple[str, int]]:
    """(kind, line) of every finding; each must be in the script itself."""
    out = set()
    for f in d.findings:
        path, _, line = f.where.rpartition(":")
        assert os.path.abspath(path) == script(name), f"{f.kind} at {f.where}, not in {name}"
        out.add((f.kind, int(line)))
    return out


@functools.cache
def diagnosed(name: str, steps: int = 8, args: tuple[str, ...] = ()) -> Diagnosis:
    """One doctor run per script and arguments, shared by the tests that read it."""
    return diagnose(script(name) if not os.path.isabs(name) else name, list(args), steps=steps)


CORPUS = [
    "clean_plain.py",
    "host_read.py",
    "recompile_shapes.py",
    "recompile_value.py",
    "cpu_fallback.py",
    "input_bound.py",
    "graph_cut.py",
    "transfer.py",
    "deprecated.py",
    "read_and_recompile.py",
    "xp_clean.py",
    "xp_host_read.py",
    "xp_cpu_fallback.py",
    "xp_read_and_fallback.py",
    "xp_compiled.py",
    "step_api.py",
    "compiled_fn.py",
    "step_api_read.py",
    "optimizer_before_move.py",
    "recompile_index.py",
    "recompile_index_fixed.py",
    "mask_index.py",
    "mask_index_fixed.py",
    "clip_clean.py",
    "hf_mask.py",
    "transfer_some.py",
    "glu_backward.py",
    "glu_fixed.py",
    "spawned.py",
    "wrong_gradient.py",
    "wrong_gradient_fixed.py",
    "xp_elu.py",
    "upsample_backward.py",
    "upsample_fixed.py",
    "wrong_ops.py",
    "wrong_ops_fixed.py",
]


@pytest.mark.serial
@pytest.mark.parametrize("name", CORPUS)
def test_each_planted_fault_is_found_at_its_line_and_nothing_else(name):
    d = diagnosed(name)
    assert d.ok, d.message
    assert d.steps == 8
    assert found(d, name) == set(marked(name, "FAULT")), [f.to_json() for f in d.findings]
    for f in d.findings:
        assert f.detail and f.fix and f.count > 0
        assert f.code, f"{f.kind} at {f.where}: the line's text"


@pytest.mark.serial  # reads the corpus's diagnoses (cached in the serial phase's one process)
def test_a_bilinear_upsamplings_backward_on_the_cpu_is_blamed_on_the_interpolate_line_with_its_fix():
    (f,) = diagnosed("upsample_backward.py").findings  # F.interpolate: the IR names torch's own frame
    assert "aten::upsample_bilinear2d_backward" in f.detail and "in the backward pass" in f.detail
    assert "interpolate(" in f.code and "M(H, oh) @ x @ M(W, ow).T" in f.fix
    assert diagnosed("upsample_fixed.py").findings == []  # the fix, applied: nothing on the CPU


@pytest.mark.serial  # reads the corpus's diagnoses (cached in the serial phase's one process)
def test_what_torch_xla_computes_wrong_is_found_first_and_its_fix_is_clean():
    elu, norm = diagnosed("wrong_gradient.py").findings  # worst first: before any cost
    assert (elu.kind, norm.kind) == ("wrong_result", "wrong_result")
    assert "1 + x instead of exp(x)" in elu.detail and "torch.expm1(x.clamp(max=0))" in elu.fix
    assert "p=inf" in norm.detail and "torch.linalg.vector_norm(x, float('inf'), dim)" in norm.fix
    assert diagnosed("wrong_gradient_fixed.py").findings == []  # the fix, applied
    assert diagnosed("xp_elu.py").findings == []  # with_device corrects both while its session lasts


def test_a_host_read_is_counted_per_step_with_the_execution_it_adds():
    (f,) = diagnosed("host_read.py").findings
    assert f.count == 1.0
    assert "1 extra XLA execution per step" in f.detail and ".item()" in f.detail
    assert f.cost_s is not None and f.cost_s > 0
    assert f.practice == {"name": "log_every", "params": {"every": 10}}


def test_changing_input_shapes_are_shown_and_padded_to_the_longest_seen():
    (f,) = diagnosed("recompile_shapes.py").findings
    assert re.search(r"s64\[16,L\]: L \d+ \(was \d+\)", f.detail), f.detail  # what changed, in words
    # batch i is 6 + 3i tokens long: 8 steps reach 27 tokens, padded up to a power of two (at least 32)
    assert "in the collate_fn: 32" in f.fix, f.fix
    # its batches are tuples, which static_shapes refuses: the fix is the code change, no practice
    assert (
        "the batches here are tuple objects: pad them in your own collate_fn" in f.fix and f.practice is None
    )
    assert f.count == 1.0 and f.cost_s is not None and f.cost_s > 0


@pytest.mark.serial  # reads the corpus's diagnoses (a neighbour could add a wait finding)
def test_the_padding_length_is_the_longest_batch_of_the_run_not_the_newest():
    d = diagnosed("recompile_shrinking.py")
    assert found(d, "recompile_shrinking.py") == set(marked("recompile_shrinking.py", "FAULT"))
    (f,) = d.findings
    # batch 0 (warm-up) is 40 tokens, batch 7 (the newest graph) 19: padded to 64, not 32
    assert "in the collate_fn: 64, the longest batch of the 8 steps run here (40)" in f.fix, f.fix


def test_a_python_number_baked_into_the_graph_is_named_with_its_line_and_values():
    (f,) = diagnosed("recompile_value.py").findings
    assert "a Python number passed to roll() changed in 5 steps of 5" in f.detail, f.detail
    assert "(argument shifts: 3, then 4, then 5, ...)" in f.detail
    assert "against" not in f.detail and f.practice is None
    (g,) = diagnosed("recompile_index.py").findings
    assert "an index t[...] changed in 5 steps of 5 (the index: 3, then 4, then 5, ...)" in g.detail
    assert "t.index_select(0, i) here instead of t[step_index], and i += 1" in g.fix
    # the fix, applied (recompile_index_fixed.py), removes the cause: that script is in CORPUS, clean


def test_a_shape_made_by_a_mask_index_is_blamed_on_it_not_on_the_batch_size():
    d = diagnosed("mask_index.py")
    recompile, fallback = d.findings
    assert recompile.kind == "recompile" and "made by aten::nonzero" in recompile.detail
    assert re.search(r"s64\[N,1\]: N \d+ \(was \d+\)", recompile.detail)  # the count, against the earlier one
    assert "not the batch size" in recompile.detail and "drop_last" not in recompile.fix
    assert "torch.where(mask, x, 0)" in recompile.fix
    # the backward pass's nonzero is the forward op's: one finding, at the forward line
    assert fallback.kind == "cpu_fallback" and "in the backward pass" in fallback.detail
    assert fallback.where == recompile.where
    # the fix, applied (mask_index_fixed.py), removes both: that script is in CORPUS, clean


def test_a_script_started_by_torch_xla_launch_is_diagnosed_in_its_replica_with_its_rank(tmp_path):
    # torch_xla.launch spawns a fresh interpreter per replica (one on the CPU runtime: nprocs None)
    d = diagnose(script("launched.py"), steps=5, keep=str(tmp_path))
    assert d.ok and d.steps == 5, d.message
    assert found(d, "launched.py") == set(marked("launched.py", "FAULT")), [f.to_json() for f in d.findings]
    (f,) = d.findings
    assert f.ranks == (0,) and f.to_json()["ranks"] == [0]
    # A second replica (rank 1) cannot run on the CPU runtime: its files are the first one's, renamed
    # and ranked 1. Its findings are merged with the first's, one finding per kind and line, both ranks.
    replica = max(
        trace_files(str(tmp_path)), key=lambda pid: os.path.getsize(trace_files(str(tmp_path))[pid])
    )
    other = replica + 1_000_000
    text = (tmp_path / f"trace-{replica}.txt").read_text()
    assert text.count('"rank": 0') == 1
    (tmp_path / f"trace-{other}.txt").write_text(
        text.replace(f'"pid": {replica},', f'"pid": {other},').replace('"rank": 0', '"rank": 1')
    )
    for graphs in tmp_path.glob(f"graphs-{replica}.txt.*"):
        (tmp_path / graphs.name.replace(str(replica), str(other))).write_text(graphs.read_text())
    outcome = child.Outcome("steps", 0, d.elapsed_s, str(tmp_path))
    merged = _diagnose(outcome, script("launched.py"), [], 5, 3, 600.0)
    assert [(g.kind, g.where, g.ranks) for g in merged.findings] == [(f.kind, f.where, (0, 1))]


@pytest.mark.serial  # reads the corpus's diagnoses (cached in the serial phase's one process)
def test_a_script_started_by_xmp_spawn_is_diagnosed_in_its_replica_too():
    (f,) = diagnosed("spawned.py").findings
    assert f.kind == "host_read" and f.ranks == (0,)


@pytest.mark.serial  # reads the corpus's diagnoses (cached in the serial phase's one process)
def test_a_backward_op_on_the_cpu_is_blamed_once_on_the_forward_call_inside_torch_with_a_lowered_one():
    (f,) = diagnosed("glu_backward.py").findings  # F.glu: its IR location is inside torch.nn.functional
    assert f.kind == "cpu_fallback" and "aten::glu_backward" in f.detail
    assert "nn.functional.glu(" in f.code and "in the backward pass" in f.detail
    assert "a * torch.sigmoid(b)" in f.fix
    assert diagnosed("glu_fixed.py").findings == []  # the fix, applied: nothing left on the CPU


@pytest.mark.serial  # reads the corpus's diagnoses (a neighbour could add a wait finding)
def test_cdist_whose_backward_falls_back_is_blamed_on_its_forward_line_and_the_fix_runs_clean():
    d = diagnosed("cdist_backward.py")
    assert found(d, "cdist_backward.py") == set(marked("cdist_backward.py", "FAULT"))
    (f,) = d.findings
    assert "aten::_cdist_backward" in f.detail and "in the backward pass" in f.detail
    assert "(a[:, None] - b[None]).norm(dim=-1)" in f.fix
    assert diagnosed("cdist_fixed.py").findings == []  # the fix, applied: nothing left on the CPU


def test_ir_locations_name_the_users_line_not_the_doctors_probe(tmp_path):
    d = diagnose(script("recompile_value.py"), steps=5, keep=str(tmp_path))
    assert d.ok, d.message
    graphs = "".join(p.read_text() for p in tmp_path.glob("graphs-*"))
    assert "aten::roll" in graphs
    assert not re.search(r"location=[^,]*probe\.py", graphs)  # no op's location is the doctor's probe
    ((_, line),) = marked("recompile_value.py", "FAULT")
    assert re.search(rf"aten::roll\(%\d+\), location=<module>@recompile_value.py:{line},", graphs)


def test_a_read_inside_library_code_names_the_library_frame_and_the_practice_made_for_it():
    (f,) = diagnosed("hf_mask.py").findings
    assert (
        "inside library code, _ignore_bidirectional_mask_sdpa at transformers/masking_utils.py:" in f.detail
    )
    assert "hf_traced_masks()" in f.fix and "torch.where" not in f.fix
    assert f.practice == {"name": "hf_traced_masks", "params": {}}
    # clip_clean.py: torch's clip_grad_norm_ makes a 0-byte host tensor inside itself: no finding (CORPUS)


def test_a_cpu_fallback_names_the_op_and_an_xla_replacement():
    (f,) = diagnosed("cpu_fallback.py").findings
    assert "aten::bincount ran on the CPU 1 time per step" in f.detail
    assert "one_hot" in f.fix
    (g,) = diagnosed("xp_cpu_fallback.py").findings
    assert "aten::median.dim_values" in g.detail and "kthvalue" in g.fix


@pytest.mark.serial
def test_waiting_for_batches_is_measured_and_the_device_loader_proposed():
    d = diagnosed("input_bound.py")
    (f,) = d.findings
    share = int(re.search(r"(\d+)% of the measured steps' time", f.detail).group(1))
    assert share >= 25
    assert f.practice == {"name": "wrap_loader_mp", "params": {}}
    # the median the finding quotes is the header's (issue 30 item 12)
    median = seconds(d.timing["step_s_median"])
    assert f"the median step takes {median})" in f.detail
    assert f"{median} per step after warm-up (median)" in summary(d)


@pytest.mark.serial
def test_a_slow_host_loader_hidden_by_the_device_loaders_queues_is_found_as_they_drain():
    d = diagnosed("input_hidden.py", steps=20)
    assert found(d, "input_hidden.py") == set(marked("input_hidden.py", "FAULT"))
    (f,) = d.findings
    drained = re.search(r"queues drained from (\d+) to (\d+) batches over the 17 steps measured", f.detail)
    if drained is not None:  # the queues still held batches: the wait is estimated, with the steps to see it
        assert int(drained.group(1)) - int(drained.group(2)) >= 3
        assert "too short to see that wait" in f.detail or int(drained.group(2)) == 0
    else:  # they emptied within the run: the wait itself is measured
        assert "of the measured steps' time is spent waiting for the next batch" in f.detail, f.detail
    assert f.practice is None and "num_workers" in f.fix  # MpDeviceLoader is already in use
    # the same dataset read by 4 workers keeps the queues full: nothing to say
    assert diagnosed("input_hidden_fixed.py", steps=20).findings == []


def test_a_second_step_marker_in_every_iteration_is_a_cut():
    d = diagnosed("graph_cut.py")
    (f,) = d.findings
    assert f.count == 1.0
    (main_line,) = [
        i for i, line in enumerate(open(script("graph_cut.py")), 1) if line.strip() == "torch_xla.sync()"
    ]
    assert f"graph_cut.py:{main_line}" in f.detail


def test_two_faults_together_give_both_findings_and_one_suggested_pipeline():
    d = diagnosed("read_and_recompile.py")
    assert {f.kind for f in d.findings} == {"host_read", "recompile"}
    assert d.findings[0].kind == "recompile"  # worst first: seconds of compiling per step
    assert d.suggestion is not None
    names = [t["name"] for t in d.suggestion.description]
    assert names == ["with_device", "log_every"]  # its tuple batches are padded by its own collate_fn
    assert xp.Pipeline.from_description(d.suggestion.description).names == tuple(names)


def test_an_xlapipe_script_says_which_practices_are_on_and_keeps_them_in_the_suggestion():
    clean = diagnosed("xp_clean.py")
    assert [p["name"] for p in clean.setup["practices"]] == ["with_device", "wrap_loader_mp"]
    assert clean.suggestion is None
    d = diagnosed("xp_host_read.py")
    assert [p["name"] for p in d.setup["practices"]] == ["with_device"]
    assert "log_every(10)" in d.findings[0].fix
    assert [t["name"] for t in d.suggestion.description] == ["with_device", "log_every"]
    plain = diagnosed("host_read.py")
    assert plain.setup["practices"] is None and "xm.add_step_closure" in plain.findings[0].fix


def test_the_setup_is_reported_without_being_a_finding():
    d = diagnosed("clean_plain.py")
    assert d.findings == []
    assert d.setup["runtime"]["device_type"] == "CPU"
    assert d.setup["runtime"]["backend"] == "torch_xla"
    assert d.setup["runtime"]["versions"]["torch_xla"].startswith("2.9")
    from xlapipe.doctor.report import summary

    assert "backend: torch_xla 2.9" in summary(d) and "TorchTPU (torch_tpu) succeeds it on TPUs" in summary(d)
    assert d.setup["parameters"] == [{"optimizer": "SGD", "kinds": {"xla:float32": 4}}]
    assert d.setup["autocast"] == ["off"]


def test_a_deprecated_environment_variable_in_force_is_a_setup_finding(monkeypatch):
    monkeypatch.setenv("XLA_USE_BF16", "1")
    d = diagnose(script("clean_plain.py"), steps=6)
    assert d.ok, d.message
    (f,) = d.findings
    assert (f.kind, f.where) == ("setup", "")
    assert "XLA_USE_BF16=1" in f.detail
    assert f.practice == {"name": "with_precision", "params": {"name": "bf16", "mode": "autocast"}}


# -- the BERT example ----------------------------------------------------------------------------


@pytest.mark.serial
def test_the_bert_example_is_clean():
    d = diagnose(NLP, NLP_TINY, steps=6)
    assert d.ok, d.message
    assert d.findings == [], [f.to_json() for f in d.findings]
    assert "static_shapes" in [p["name"] for p in d.setup["practices"]]


def test_the_bert_example_without_static_shapes_recompiles_and_gets_static_shapes_back(monkeypatch):
    d = diagnose(NLP, ["--without", "static_shapes", *NLP_TINY], steps=5)  # 2 steps after warm-up
    assert d.ok, d.message
    assert [f.kind for f in d.findings] == ["recompile"], [f.to_json() for f in d.findings]
    (f,) = d.findings
    assert "_common.py:" in f.where
    assert 'run.batches("train")' in f.code  # the loop whose device loader marks the steps
    lengths = [int(n) for pair in re.findall(r"L (\d+) \(was (\d+)\)", f.detail) for n in pair]
    assert lengths and f.practice["name"] == "static_shapes"
    length = f.practice["params"]["length"]
    assert max(lengths) <= length < 2 * max(lengths) and length & (length - 1) == 0  # a power of two
    # what comes back is exactly the pipeline the example ships with (docs/examples.md)
    monkeypatch.syspath_prepend(os.path.join(ROOT, "examples"))
    import _common

    shipped = _common.default_pipeline(text=True, transformers=True, on_tpu=False)
    assert xp.Pipeline.from_description(d.suggestion.description) == shipped


# -- the command line, its outputs, bad input ------------------------------------------------------


def test_the_command_writes_json_a_markdown_report_and_the_pipeline(tmp_path, capsys):
    out, report = tmp_path / "out", tmp_path / "d.json"
    code = main(["doctor", script("host_read.py"), "--steps", "6", "--json", str(report), "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["steps"] == 6 and data["ok"] is True
    kinds = [f["kind"] for f in data["findings"]]
    # the planted fault, and besides it at most a finding timed on this machine: a busy machine
    # (CI's parallel tests) can make the tiny script's plain loader a quarter of its step
    assert kinds.count("host_read") == 1 and set(kinds) <= {"host_read", "input_bound"}, kinds
    assert f"{len(kinds)} finding" in text and ". host_read at" in text
    (f,) = [f for f in data["findings"] if f["kind"] == "host_read"]
    assert {"kind", "where", "count", "cost_s", "detail", "fix"} <= set(f)
    assert sorted(p.name for p in out.iterdir()) == [
        "pipeline.json",
        "pipeline.py",
        "report.json",
        "report.md",
    ]
    scope: dict = {}
    exec((out / "pipeline.py").read_text(), scope)
    assert scope["pipeline"] == xp.Pipeline.from_description(json.loads((out / "pipeline.json").read_text()))
    assert "## Findings" in (out / "report.md").read_text()


def test_a_missing_script_is_refused_before_anything_runs(capsys):
    assert main(["doctor", "no/such/train.py"]) == 2
    err = capsys.readouterr().err
    assert "no script 'no/such/train.py'" in err and "running" not in err
    with pytest.raises(ValueError, match="two steps after the warm-up"):
        diagnose(script("clean_plain.py"), steps=4, warmup=3)


def test_a_script_that_fails_is_reported_with_its_error_its_line_and_the_findings_so_far(capsys):
    code = main(["doctor", script("crash.py"), "--steps", "8"])
    assert code == 1
    text = capsys.readouterr().out
    (crash_line,) = [line for _, line in marked("crash.py", "CRASH")]
    shown = os.path.relpath(script("crash.py"))  # paths under the working folder are shown relative to it
    assert f"the script failed after 6 steps at {shown}:{crash_line}" in text
    assert "ValueError: planted: the loss went NaN" in text
    assert "probe.py" not in text  # the traceback shown is the script's, as python shows it
    ((_, read_line),) = marked("crash.py", "FAULT")
    assert f"1. host_read at {shown}:{read_line}" in text


@pytest.mark.parametrize("name", ["no_sync.py", "no_marker_read.py"])
def test_a_script_with_no_step_marker_is_told_where_to_put_one(name):
    d = diagnose(script(name), steps=5)  # stopped after 5 optimizer updates, not run to its end
    assert (d.status, d.steps, d.ok) == ("no marker", 0, True), d.message
    assert found(d, name) == set(marked(name, "FAULT")), [f.to_json() for f in d.findings]
    (f,) = d.findings
    ((_, line),) = marked(name, "FAULT")
    assert f"add torch_xla.sync() right after optimizer.step() (here: after line {line})" in f.fix
    if name == "no_marker_read.py":  # the read is what ran each iteration's graph, compiled anew
        assert '(print(f"loss {loss.item():.4f}"): .item()), 1 time per update' in f.detail, f.detail
        assert "1 compilation per update" in f.detail
    else:
        assert "nothing ran in these updates" in f.detail


def test_no_step_marker_does_not_hide_an_optimizer_that_trains_nothing():
    d = diagnose(script("no_marker_optimizer.py"), steps=5)
    assert d.status == "no marker", d.message
    assert found(d, "no_marker_optimizer.py") == set(marked("no_marker_optimizer.py", "FAULT"))
    assert [f.kind for f in d.findings] == ["optimizer", "step_marker"]  # the silent wrong result first


def test_a_script_that_starts_its_own_training_process_is_told_so_with_its_output():
    d = diagnose(script("own_process.py"), steps=5)
    ((_, line),) = marked("own_process.py", "STARTS")
    assert d.status == "no steps", d.message
    assert "It started 1 process of its own (`" in d.message and "clean_plain.py` at " in d.message
    assert f"own_process.py:{line}" in d.message, d.message
    assert "xlapipe doctor THAT_SCRIPT" in d.message
    assert "--- the last lines of its output ---" in d.message
    assert "final loss" in d.message and "the worker finished" in d.message  # the worker's output too


def test_a_script_that_never_marks_a_step_nor_imports_torch_xla_says_so():
    e = diagnose(script("not_xla.py"), steps=6)
    assert e.status == "no steps" and "It never imported torch_xla" in e.message


def test_a_script_that_ends_before_the_steps_asked_says_how_far_it_got(capsys):
    assert main(["doctor", script("clean_plain.py"), "--steps", "20"]) == 1
    text = capsys.readouterr().out
    assert "the script ended after 10 steps, before the 20 asked (--steps 20)" in text
    assert "--- the last lines of its output ---" in text and "final loss 0." in text  # as it ended
    assert "The findings below cover the 7 steps after the 3-step warm-up." in text
    assert "0 findings." in text


def test_a_script_that_hangs_is_stopped_at_the_timeout_with_where_it_was():
    d = diagnose(script("hang.py"), steps=8, timeout=25)  # ample for 4 steps on a loaded machine
    assert d.status == "timeout" and d.steps == 4
    ((_, line),) = marked("hang.py", "HANG")
    assert "within 25 s (--timeout)" in d.message
    assert f"hang.py:{line} (time.sleep(3600)" in d.message


# -- what the doctor leaves behind -----------------------------------------------------------------


def test_the_script_runs_as_python_runs_it_and_the_instrumentation_is_gone_when_it_ends(tmp_path):
    seen_file = tmp_path / "seen.json"
    d = diagnose(script("state.py"), [str(seen_file), "--flag"], steps=10)
    assert d.status == "ended" and d.steps == 4  # 64 samples in batches of 16
    seen = json.loads(seen_file.read_text())
    assert seen["argv"] == [script("state.py"), str(seen_file), "--flag"]
    assert seen["name"] == "__main__" and seen["path0"] == SCRIPTS and seen["file"] == script("state.py")
    during, after = seen["during"], seen["at_exit"]
    assert len(during["wrapped"]) == 12 and during["function_modes"] == 1
    assert during["optimizer_hooks"] == during["forward_hooks"] == 1
    assert after == {
        "wrapped": [],
        "function_modes": 0,
        "optimizer_hooks": 0,
        "forward_hooks": 0,
        "import_hooks": [],
    }


def test_the_run_leaves_no_temporary_files(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = diagnose(script("clean_plain.py"), steps=5, overhead=True)
    assert d.ok and list(tmp_path.iterdir()) == []
    assert d.overhead and d.overhead["plain_step_s_median"] > 0 and d.overhead["ratio"] > 0


def test_the_doctor_never_starts_the_runtime_and_import_xlapipe_never_loads_it():
    code = (
        "import sys\n"
        "import xlapipe\n"
        "print('LOADED', any(m.startswith('xlapipe.doctor') for m in sys.modules))\n"
        "from xlapipe.cli import main\n"
        f"code = main(['doctor', {script('clean_plain.py')!r}, '--steps', '5'])\n"
        "print('ABLATION', sorted(m for m in sys.modules if m.startswith('xlapipe.ablation')))\n"
        "import torch_xla\n"
        "print('RUNTIME', torch_xla._XLAC._xla_runtime_is_initialized(), code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "LOADED False" in out.stdout, out.stderr[-2000:]
    assert "ABLATION []" in out.stdout, out.stdout  # the doctor loads nothing of the ablation runner
    assert "RUNTIME False 0" in out.stdout, out.stderr[-2000:]


def test_a_json_file_in_a_missing_folder_is_refused_before_the_run(tmp_path, capsys):
    missing = tmp_path / "missing" / "dir" / "r.json"
    assert main(["doctor", script("clean_plain.py"), "--json", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "no folder" in err and "running" not in err
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_doctor_stops_the_script_and_removes_its_folder(tmp_path, signum):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    doctor = subprocess.Popen(
        [sys.executable, "-m", "xlapipe.cli", "doctor", script("hang.py"), "--steps", "8"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        pid = None
        while pid is None and time.monotonic() < deadline:  # the script's first step: it is running
            for trace in tmp_path.glob("xlapipe-doctor-*/trace-*.txt"):
                if '"kind": "marker_end"' in trace.read_text(errors="replace"):
                    pid = int(trace.stem.split("-")[1])
            time.sleep(0.2)
        assert pid is not None, "the script never made a step"
        doctor.send_signal(signum)
        out, err = doctor.communicate(timeout=60)
    finally:
        doctor.kill()
    assert doctor.returncode == 128 + signum, err[-2000:]
    assert f"interrupted by {signal.Signals(signum).name}" in err
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the script is gone (tests/test_child_process.py: everything it started too)
    assert list(tmp_path.iterdir()) == []
