"""recompile_guard: it speaks up when a new shape recompiles, and only then."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_model
from xlapipe.transform import OrderError
from xlapipe.transforms import compile_step, recompile_guard, unguarded
from xlapipe.transforms.recompile_guard import RecompileError, RecompileWarning, events, shapes


def batches(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn(n, 8, generator=g)
        out.append((x, (x.sum(1) > 0).long()))
    return out


def setup(sizes):
    model = tiny_model()
    return xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), {"train": batches(sizes)}
    )


def train(pipe, sizes, epochs=1):
    with xp.session(pipe(setup(sizes))) as run:
        for _ in range(epochs):
            for batch in run.loaders["train"]:
                run.step(batch, loss_fn)
        return events(run)


@pytest.mark.parametrize("loader", [False, True], ids=["own-sync", "wrap_loader_mp"])
def test_stays_quiet_on_a_stable_loop(loader):
    pipe = xp.Pipeline(
        xp.with_device(),
        *([xp.wrap_loader_mp()] if loader else []),
        recompile_guard(warmup=2, action="raise"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileWarning)
        assert train(pipe, [16] * 6, epochs=2) == []


@pytest.mark.parametrize("loader", [False, True], ids=["own-sync", "wrap_loader_mp"])
def test_raises_on_a_shape_change_with_step_and_shapes(loader):
    odd = 5 if loader else 7  # a batch size no other test compiled in this process
    pipe = xp.Pipeline(
        xp.with_device(),
        *([xp.wrap_loader_mp()] if loader else []),
        recompile_guard(warmup=2, action="raise"),
    )
    with pytest.raises(RecompileError) as caught:
        train(pipe, [16, 16, 16, 16, odd, 16])
    event = caught.value.event
    assert event["step"] == 5
    assert event["when"] == ("at the step marker after it" if loader else "during it")
    assert event["shapes"] == {"batch[0]": [odd, 8], "batch[1]": [odd]}
    assert event["warmup_shapes"] == [{"batch[0]": [16, 8], "batch[1]": [16]}]
    message = str(caught.value)
    assert "step 5" in message and f"batch[0] ({odd}, 8) (warm-up: (16, 8))" in message
    assert "explain=True" in message  # how to get torch_xla's own account of the cause


def test_warns_and_keeps_training():
    pipe = xp.Pipeline(xp.with_device(), recompile_guard(warmup=2))
    with pytest.warns(RecompileWarning, match="step 4"):
        seen = train(pipe, [16, 16, 16, 12, 12, 16])
    assert [e["step"] for e in seen] == [4]  # the second 12-row batch reuses the graph


def test_sees_torch_compile_recapturing_a_new_shape():
    pipe = xp.Pipeline(xp.with_device(), compile_step(), recompile_guard(warmup=2, action="raise"))
    with pytest.raises(RecompileError, match="step 4") as caught:
        train(pipe, [16, 16, 16, 4])
    assert caught.value.event["when"] == "during it"


def test_unguarded_code_between_steps_is_not_held_against_training():
    pipe = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), recompile_guard(warmup=2, action="raise"))
    with xp.session(pipe(setup([16] * 4))) as run:
        for _epoch in range(2):
            for batch in run.loaders["train"]:
                run.step(batch, loss_fn)
            with unguarded(run), torch.no_grad():  # evaluation: new graphs, on purpose
                x = torch.randn(5, 8).to(run.device)
                run.model(x).sum().item()
        assert events(run) == []


def test_relations_parameters_and_shapes():
    with pytest.raises(OrderError, match="needs with_device"):
        xp.Pipeline(recompile_guard())
    for bad in ({"warmup": -1}, {"action": "ignore"}, {"explain": 1}):
        with pytest.raises(ValueError, match="recompile_guard"):
            recompile_guard(**bad)
    pipe = xp.Pipeline(xp.with_device(), recompile_guard(warmup=5, action="raise"))
    assert xp.Pipeline.from_description(json.loads(json.dumps(pipe.describe()))) == pipe
    assert recompile_guard(explain=True).effects[0].describe() == {
        "effect": "env",
        "name": "PT_XLA_DEBUG_LEVEL",
        "value": "1",
    }
    assert shapes({"a": torch.zeros(2, 3), "b": [torch.zeros(4)], "c": 1}) == {
        "batch['a']": (2, 3),
        "batch['b'][0]": (4,),
    }


EXPLAIN = r"""
import sys, torch, warnings
sys.path.insert(0, {tests!r})
import xlapipe as xp
from helpers import loss_fn
from test_recompile_guard import setup
from xlapipe.transforms import recompile_guard
from xlapipe.transforms.recompile_guard import RecompileError
pipe = xp.Pipeline(xp.with_device(), recompile_guard(warmup=2, action="raise", explain=True))
try:
    with xp.session(pipe(setup([16, 16, 16, 8]))) as run:
        for batch in run.loaders["train"]:
            run.step(batch, loss_fn)
except RecompileError as error:
    print(error)
"""


def test_explain_reports_torch_xlas_compilation_analysis(tmp_path):
    # PT_XLA_DEBUG_LEVEL is read when the runtime starts: a fresh process.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
    env["PJRT_DEVICE"] = "CPU"
    env["TMPDIR"] = str(tmp_path)
    code = EXPLAIN.format(tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "step 4" in out.stdout
    assert "torch_xla's compilation analysis" in out.stdout
    assert "Compilation Cause" in out.stdout and "Graph Hash" in out.stdout
