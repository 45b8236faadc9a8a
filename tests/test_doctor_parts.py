"""The doctor's pieces on text torch_xla and faulthandler really write (no process started)."""

from __future__ import annotations

import xlapipe as xp
from xlapipe.doctor.events import Analysis, Frame, Record, read_events
from xlapipe.doctor.findings import Finding
from xlapipe.doctor.frames import Libraries, user_frame
from xlapipe.doctor.graphs import Change, compare, in_words, ops
from xlapipe.doctor.stacks import read_stacks
from xlapipe.doctor.suggest import python, suggest

# As PT_XLA_DEBUG_LEVEL=2 writes it (torch_xla 2.9), with a probe record between and a line being written.
TRACE = """
Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: 1e763b4c83085e2f54e5508e16d004f9
Compilation Analysis:   Number of Graph Inputs: 6
Compilation Analysis:   Number of Graph Outputs: 1
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   <module> (/tmp/train.py:13)
Compilation Analysis:   _run_code (<frozen runpy>:88)
Compilation Analysis: --------------------------------------------------------------------------------
Compilation Analysis: ================================================================================

Computation hash: 231b8a1cb740c6d20c3970cff003157f

Post Compilation Analysis: ================================================================================
Post Compilation Analysis: Graph input size: 0.000001 GB
Post Compilation Analysis: ================================================================================
xlapipe-doctor {"kind": "marker", "pid": 7, "thread": 3, "n": 1, "stack": [["/tmp/train.py", 15, "<module>"]]}

Execution Analysis: ================================================================================
Execution Analysis: Execution Cause
Execution Analysis:   user torch_xla.sync
Execution Analysis: Graph Info:
Execution Analysis:   Graph Hash: e28bd1ffb966bba0ef2cbb841337953c
Execution Analysis: Python Frame Triggered Execution:
Execution Analysis:   sync (/venv/lib/python3.11/site-packages/torch_xla/torch_xla.py:87)
Execution Analysis:   <module> (/tmp/train.py:15)
Execution Analysis: --------------------------------------------------------------------------------
Execution Analysis: ================================================================================
xlapipe-doctor {"kind": "marker_end", "pid": 7, "thread": 3, "n": 1, "st"""
TRACE = TRACE.replace("Info:\n", "Info: \n").replace(
    "Execution:\n", "Execution: \n"
)  # torch_xla's trailing spaces

IR_16_37 = """  %0 = s64[16,37]{1,0} xla::device_data(), location=next@parallel_loader.py:40, xla_shape=s64[16,37]{1,0}
  %1 = f32[50,8]{1,0} xla::device_data(), xla_shape=f32[50,8]{1,0}
  %2 = f32[16,37,8]{2,1,0} aten::embedding(%1, %0), location=forward@sparse.py:190, xla_shape=f32[16,37,8]{2,1,0}
  %3 = f32[16,8]{1,0} aten::mean(%2), location=forward@train.py:12, xla_shape=f32[16,8]{1,0}, ROOT=0"""


def test_torch_xlas_analyses_and_the_probes_records_are_read_in_order(tmp_path):
    path = tmp_path / "trace-7.txt"
    path.write_text(TRACE)
    events = read_events(str(path))
    assert [type(e).__name__ for e in events] == [
        "Analysis",
        "Record",
        "Analysis",
    ]  # the cut line is left out
    compiled, marker, executed = events
    assert isinstance(compiled, Analysis) and isinstance(executed, Analysis) and isinstance(marker, Record)
    assert (compiled.kind, compiled.graph) == ("compile", "1e763b4c83085e2f54e5508e16d004f9")
    assert compiled.cause == "most likely user code trying to access tensor value before torch_xla.sync"
    assert compiled.frames == (
        Frame("/tmp/train.py", 13, "<module>"),
        Frame("<frozen runpy>", 88, "_run_code"),
    )
    assert (executed.kind, executed.cause) == ("execute", "user torch_xla.sync")
    assert (
        marker.kind == "marker"
        and marker.thread == 3
        and marker.frames() == (Frame("/tmp/train.py", 15, "<module>"),)
    )


def test_the_users_line_is_the_innermost_outside_torch_torch_xla_xlapipe_and_python():
    libraries = Libraries.from_record(
        {
            "own": ["/venv/site/torch", "/venv/site/torch_xla"],
            "python": ["/py/lib"],
            "third_party": ["/venv/site"],
        }
    )
    frames = [
        Frame("/venv/site/torch_xla/torch_xla.py", 87, "sync"),
        Frame("/venv/site/transformers/modeling_bert.py", 700, "forward"),
        Frame("/py/lib/contextlib.py", 81, "inner"),
        Frame("/home/me/train.py", 42, "step"),
        Frame("<frozen runpy>", 88, "_run_code"),
    ]
    assert user_frame(frames, libraries) == Frame("/home/me/train.py", 42, "step")
    assert user_frame(frames[:3], libraries) == Frame(
        "/venv/site/transformers/modeling_bert.py", 700, "forward"
    )
    assert user_frame(frames[:1], libraries) is None
    assert libraries.kind("<string>") == "user" and libraries.kind("<eval_with_key>.3") == "library"


def test_a_new_input_shape_is_told_from_a_changed_op_and_from_a_changed_value():
    assert [str(o) for o in ops(IR_16_37)][
        2
    ] == "aten::embedding f32[16,37,8] (traced at forward@sparse.py:190)"
    longer = IR_16_37.replace("16,37", "16,52")
    change = compare(longer, [IR_16_37])
    assert change is not None and change.kind == "shapes"
    assert (change.new_inputs, change.old_inputs) == (("s64[16,52]",), ("s64[16,37]",))
    assert change.got is not None and change.got.shape == "f32[16,52,8]"
    other = IR_16_37.replace("aten::mean", "aten::sum")
    change = compare(other, [IR_16_37, longer])
    assert change is not None and change.kind == "structure"
    assert (change.got.op, change.expected.op) == ("aten::sum", "aten::mean")
    assert "train.py:12" in change.describe()
    same = compare(IR_16_37, [longer, IR_16_37])  # the same text under another hash: a baked value
    assert same is not None and same.kind == "value"
    assert compare(IR_16_37, []) is None


def test_a_changed_shape_is_said_in_words_with_the_earlier_shape():
    # issue 30 item 12: what changed, against what it was; never a bare list against "(none)"
    assert in_words(("s64[16,52]",), ("s64[16,37]",)) == "s64[16,L]: L 52 (was 37)"
    assert in_words(("s64[6,1]",) * 3, ("s64[10,1]",) * 3, "N") == "s64[N,1]: N 6 (was 10), 3 inputs"
    assert in_words(("f32[32,32]",) * 6, ()) == "new inputs 6 x f32[32,32] the earlier graph did not have"
    assert in_words((), ("f32[8]",)) == "inputs f32[8] the earlier graph had are gone"
    assert in_words(("f32[2,3]",), ("f32[4,5]",)) == "f32[2,3] (was f32[4,5])"  # two dimensions moved
    told = Change("structure", ("f32[32,32]",) * 6, ()).describe()
    assert (
        told
        == "inputs changed against the closest earlier graph: new inputs 6 x f32[32,32] the earlier graph did not have"
    )


def test_the_calls_torch_xla_computes_wrong_are_told_from_their_right_neighbours():
    import torch

    from xlapipe.doctor.checks.wrong_results import LOWERED, WRONG
    from xlapipe.doctor.probe import WRONG_ON_XLA, _computed_wrong

    assert set(WRONG) == set(LOWERED) == set(WRONG_ON_XLA)  # every call noted has its words and its fix
    x, image, batch = torch.ones(2, 3, 4), torch.ones(1, 1, 4, 4), torch.ones(3, 4, 4)

    def wrong(name, t, *args, **kwargs):
        return _computed_wrong(name, t, (t, *args), kwargs)

    with torch.no_grad():
        assert (
            wrong("amax", x)
            and wrong("amin", x, ())
            and not wrong("amax", x, 0)
            and not wrong("amax", x, (1, 2))
        )
        assert (
            wrong("sum", x, ())
            and wrong("mean", x, dim=[])
            and not wrong("sum", x)
            and not wrong("var", x, None)
        )
        assert wrong("diagonal", x) and wrong("diagonal", x, 1, 0, 1)
        assert (
            not wrong("diagonal", x, 0, 1, 0)
            and not wrong("diagonal", x, 0, 0, 2)
            and not wrong("diagonal", x[0])
        )
        assert wrong("interpolate", image, None, 0.6) and wrong(
            "interpolate", image, scale_factor=1.7, mode="bilinear"
        )
        assert not wrong("interpolate", image, None, 2.0) and not wrong("interpolate", image, (3, 3))
        assert not wrong("interpolate", image, None, 0.6, recompute_scale_factor=True)
        assert not wrong("interpolate", image, None, 0.6, "bilinear", True)  # align_corners: right
        assert not wrong("interpolate", image, None, 0.6, "bicubic")  # runs on the CPU: right
        assert wrong("svd", batch) and wrong("linalg_svd", batch) and not wrong("svd", batch[0])
        assert (
            wrong("norm", x, float("inf")) and wrong("norm", x, p=-float("inf")) and not wrong("norm", x, 2)
        )
        assert not wrong("elu", x)  # no gradient needed: elu's forward is right
    assert wrong("elu", x.clone().requires_grad_())


def test_faulthandlers_dump_is_read_thread_by_thread(tmp_path):
    path = tmp_path / "stacks-7.txt"
    path.write_text(
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/py/lib/threading.py", line 320 in wait\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/home/me/train.py", line 13 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    threads = read_stacks(str(path))
    assert threads[0x7F0000000002] == [
        Frame("/home/me/train.py", 13, "<module>"),
        Frame("<frozen runpy>", 88, "_run_code"),
    ]
    assert threads[0x7F0000000001] == [Frame("/py/lib/threading.py", 320, "wait")]


def test_the_suggested_pipeline_keeps_the_practices_on_and_shows_only_parameters_that_matter():
    on = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"), xp.wrap_loader_mp()).describe()
    findings = [
        Finding(
            "setup",
            "",
            1.0,
            None,
            "XLA_USE_BF16",
            "autocast",
            {"name": "with_precision", "params": {"name": "bf16", "mode": "autocast"}},
        ),
        Finding(
            "recompile",
            "t.py:3",
            1.0,
            2.0,
            "shapes",
            "pad",
            {"name": "static_shapes", "params": {"length": 128}},
        ),
        Finding("host_read", "t.py:4", 1.0, 0.1, "read", "later", None),
    ]
    s = suggest(on, findings)
    assert s is not None and s.note == "" and s.added == ("with_precision", "static_shapes")
    pipeline = xp.Pipeline.from_description(s.description)
    assert pipeline == xp.Pipeline(
        xp.with_device(), xp.with_precision("bf16"), xp.static_shapes(length=128), xp.wrap_loader_mp()
    )
    assert "    xp.static_shapes(length=128),\n" in s.python and "    xp.with_precision(),\n" in s.python
    scope: dict = {}
    exec(s.python, scope)
    assert scope["pipeline"] == pipeline
    assert suggest(None, findings[2:]) is None  # nothing to add: no suggestion
    assert python(
        [{"name": "wrap_loader_mp", "params": {"loader_prefetch_size": 32, "device_prefetch_size": 8}}]
    ).endswith("    xp.wrap_loader_mp(loader_prefetch_size=32),\n)")


def test_a_practice_with_a_function_of_the_script_keeps_its_other_parameters_and_says_so():
    from xlapipe.doctor.harness import described

    t = xp.log_every(5, to=lambda metrics: None)  # a function of the script: no description holds it
    d = described(t)
    assert d["params"] == {"every": 5} and list(d["undescribed"]) == ["to"]
    finding = Finding(
        "recompile", "t.py:3", 1.0, 2.0, "shapes", "pad", {"name": "static_shapes", "params": {"length": 64}}
    )
    s = suggest([{"name": "with_device", "params": {}}, d], [finding])
    assert s is not None
    pipeline = xp.Pipeline.from_description(s.description)
    assert pipeline == xp.Pipeline(xp.with_device(), xp.log_every(5), xp.static_shapes(length=64))
    assert "log_every's to=" in s.note and "pass it again in Python" in s.note


def test_every_practice_a_finding_suggests_round_trips_through_from_description():
    from xlapipe.doctor.checks.environment import APIS, BF16

    practices = [
        {"name": "static_shapes", "params": {"length": 32}},
        {"name": "log_every", "params": {"every": 10}},
        {"name": "wrap_loader_mp", "params": {}},
        BF16,
        *[p for _, p in APIS.values() if p is not None],
    ]
    findings = [Finding("x", f"t.py:{i}", 1.0, 1.0, "d", "f", p) for i, p in enumerate(practices)]
    s = suggest(None, findings)
    assert s is not None and s.note == "", s.note
    pipeline = xp.Pipeline.from_description(s.description)
    assert set(pipeline.names) == {"with_device"} | {p["name"] for p in practices}
    assert xp.Pipeline.from_description(pipeline.describe()) == pipeline
    scope: dict = {}
    exec(s.python, scope)
    assert scope["pipeline"] == pipeline


def _input_context(waits: list[float], queued: list[int], warmup: int = 2):
    from xlapipe.doctor.findings import Context
    from xlapipe.doctor.timeline import Step, Timeline

    site = Frame("/work/train.py", 12, "main")
    steps = [
        Step(i + 1, step_s=0.1 + w, wait_s=w, loader_site=site, device_loader=True, queued=q)
        for i, (w, q) in enumerate(zip(waits, queued))
    ]
    return Context(Timeline(1, steps, [], Libraries()), warmup, "/work", None)


def test_input_wait_is_judged_from_the_step_the_device_loaders_queues_first_ran_empty():
    """Filled while the first graphs compiled, the queues hide a slow host loader for 16 steps; from
    the step they run empty on, every step waits 0.1 s of its 0.2 s: 50% in the steady state, where
    all the measured steps would say 35%."""
    from xlapipe.doctor.checks import input_wait

    waits = [0.0] * 16 + [0.1] * 16
    queued = [8 - i // 2 for i in range(16)] + [0] * 16  # 8 ready, one lost every other step; empty at 17
    (found,) = input_wait.check(_input_context(waits, queued))
    assert "50% of the measured steps' time" in found.detail, found.detail
    assert "counted from step 17" in found.detail and "first ran empty" in found.detail
    # queues that never run empty (the host loader keeps up): every measured step, no "counted from"
    (steady,) = input_wait.check(_input_context([0.1] * 32, [4] * 32))
    assert "counted from" not in steady.detail


def test_findings_are_ranked_worst_first_a_model_that_does_not_train_before_any_cost():
    from xlapipe.doctor.checks import worst_first
    from xlapipe.doctor.findings import Finding

    def finding(kind: str, cost: float | None) -> Finding:
        return Finding(kind, "train.py:1", 1.0, cost, "detail", "fix")

    ranked = worst_first(
        [
            finding("setup", None),
            finding("recompile", 0.5),
            finding("optimizer", None),
            finding("host_read", 2.0),
        ]
    )
    assert [f.kind for f in ranked] == ["optimizer", "host_read", "recompile", "setup"]
