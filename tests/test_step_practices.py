"""torch_xla's own recommended practices on the hook protocol: torch_xla.compile, host reads, a
recompilation's first differing op, a profiler window."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import torch_xla.debug.metrics as met

import xlapipe as xp
from helpers import loss_fn, tiny_model, tiny_setup, train_losses
from xlapipe.transforms.compile_step import CompileStepError
from xlapipe.transforms.recompile_guard import RecompileError, events


def reading_loss(model, batch):
    loss = loss_fn(model, batch)
    print("loss", float(loss.detach()))  # the host read under test
    return loss


# -- compile_step(backend="torch_xla") -------------------------------------------------------


@pytest.mark.parametrize("loader_mp", [False, True])
def test_torch_xla_compile_region_trains_like_the_lazy_loop(loader_mp):
    base = [xp.with_device(), *([xp.wrap_loader_mp()] if loader_mp else [])]
    lazy = train_losses(xp.Pipeline(*base)(tiny_setup("adamw")), epochs=2)
    region = xp.Pipeline(*base, xp.compile_step(backend="torch_xla", full_graph=True))
    setup = region(tiny_setup("adamw"))
    markers = met.counter_value("MarkStep") or 0
    got = train_losses(setup, epochs=2)
    assert got == lazy  # the same lazy graph, bit for bit
    assert (met.counter_value("MarkStep") or 0) - markers >= 8  # the region marks its own steps


def test_torch_xla_compile_region_refuses_a_host_read_and_a_new_graph():
    pipeline = xp.Pipeline(xp.with_device(), xp.compile_step(backend="torch_xla", full_graph=True))
    with pytest.raises(xp.HostReadError, match=r"test_step_practices.py:\d+ \(in reading_loss\)"):
        _train(pipeline, reading_loss)
    capped = xp.Pipeline(xp.with_device(), xp.compile_step(backend="torch_xla", max_different_graphs=1))
    model = tiny_model()
    batches = [(torch.randn(n, 8), torch.zeros(n, dtype=torch.long)) for n in (16, 16, 11)]
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": batches})
    with pytest.raises(
        CompileStepError, match=r"(?s)unlike the ones before it.*Got: .*Expected: .*static_shapes"
    ):
        with xp.session(capped(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)


def _train(pipeline, fn):
    with xp.session(pipeline(tiny_setup())) as run:
        for batch in run.batches("train"):
            run.step(batch, fn)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(backend="torch_xla", optimizer=True), "optimizer=True is an option of backend='openxla'"),
        (dict(full_graph=True), "options of backend='torch_xla'"),
        (dict(backend="torch_xla", max_different_graphs=0), "max_different_graphs must be a positive int"),
    ],
)
def test_compile_step_options_belong_to_their_backend(bad, message):
    with pytest.raises(ValueError, match=message):
        xp.compile_step(**bad)


# -- no_host_reads ---------------------------------------------------------------------------


def test_no_host_reads_names_the_line_that_read_and_lets_a_clean_step_through():
    pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), xp.no_host_reads())
    with pytest.raises(xp.HostReadError) as caught:
        _train(pipeline, reading_loss)
    assert "test_step_practices.py" in str(caught.value) and 'print("loss", float(loss.detach()))' in str(
        caught.value
    )
    assert "log_every" in str(caught.value)  # the fix
    _train(pipeline, loss_fn)  # no read: trains
    with xp.session(pipeline(tiny_setup())) as run:  # reads after the step are fine
        for batch in run.batches("train"):
            float(run.step(batch, loss_fn))


def test_no_host_reads_refuses_fp16_and_compile_step():
    with pytest.raises(ValueError, match="fp16's gradient scaler reads found_inf"):
        _train(xp.Pipeline(xp.with_device(), xp.with_precision("fp16"), xp.no_host_reads()), loss_fn)
    with pytest.raises(xp.OrderError, match="no_host_reads excludes compile_step"):
        xp.Pipeline(xp.with_device(), xp.compile_step(), xp.no_host_reads())


# -- recompile_guard names the first op that differs -------------------------------------------


def batches_of(sizes):
    g = torch.Generator().manual_seed(3)
    return [(x := torch.randn(n, 8, generator=g), (x.sum(1) > 0).long()) for n in sizes]


def test_the_guard_names_the_first_op_and_the_new_input_shapes():
    model = tiny_model()
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": batches_of([16, 16, 16, 13])}
    )
    pipeline = xp.Pipeline(xp.with_device(), xp.recompile_guard(warmup=2, action="raise"))
    with pytest.raises(RecompileError) as caught:
        _run(pipeline(setup), loss_fn)
    difference = caught.value.event["difference"]
    assert difference["new_inputs"] == "f32[13,8]{1,0}, s64[13]{0}"
    assert "13" in difference["shape"] and "16" in difference["expected_shape"]
    assert "The first op that differs from the closest warm-up graph" in str(caught.value)


def test_the_guard_names_a_new_op_when_the_shapes_stay_the_same():
    def sometimes_scaled(model, batch):
        loss = loss_fn(model, batch)
        return loss * 2.5 if len(calls) == 3 else loss

    calls: list[int] = []

    def counting(model, batch):
        calls.append(1)
        return sometimes_scaled(model, batch)

    model = tiny_model()
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": batches_of([16] * 4)}
    )
    with pytest.warns(xp.RecompileWarning, match="shapes match the warm-up's") as caught:
        with xp.session(xp.Pipeline(xp.with_device(), xp.recompile_guard(warmup=2))(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, counting)
            seen = events(run)
    assert [e["step"] for e in seen] == [3]
    assert seen[0]["difference"]["op"] == "aten::mul" and seen[0]["difference"]["new_inputs"] == ""
    assert "aten::mul" in str(caught[0].message)


def _run(setup, fn):
    with xp.session(setup) as run:
        for batch in run.batches("train"):
            run.step(batch, fn)


# -- profile -------------------------------------------------------------------------------------


@pytest.mark.parametrize("loader_mp", [False, True])
def test_profile_traces_the_window_and_says_where_the_time_went(tmp_path, loader_mp):
    out = tmp_path / "trace"
    model = tiny_model()
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": batches_of([16] * 8)}
    )
    pipeline = xp.Pipeline(
        xp.with_device(),
        *([xp.wrap_loader_mp()] if loader_mp else []),
        xp.profile(steps=(4, 6), out=str(out)),
    )
    _run(pipeline(setup), loss_fn)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Profile of steps 4 to 6\n")
    assert "3 steps in" in summary and "| compilations | 0 " in summary  # after warm-up: nothing compiles
    traces = list(out.glob("plugins/profile/*/*.trace.json.gz"))
    assert len(traces) == 1 and list(out.glob("plugins/profile/*/*.xplane.pb"))
    names = {e.get("name") for e in json.load(gzip.open(traces[0], "rt"))["traceEvents"]}
    assert "StepMarker" in names  # the steps' markers are in the window
    assert "| StepMarker |" in summary or "| SyncTensorsGraph |" in summary


def test_profile_refuses_the_first_step_and_bad_windows():
    with pytest.raises(ValueError, match="start at step 1, which compiles"):
        xp.profile(steps=(1, 5))
    with pytest.raises(ValueError, match="1 <= start <= stop"):
        xp.profile(steps=(6, 5))
    with pytest.raises(xp.OrderError, match="profile needs with_device"):
        xp.Pipeline(xp.profile())
