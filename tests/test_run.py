"""The user's side of a session: evaluation under any pipeline, the weights back, the run's life."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch
from attrs import frozen
from torch import nn

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup
from test_equivalence import VALID, ids
from xlapipe.transforms.recompile_guard import events


def with_eval(setup: xp.TrainingSetup) -> xp.TrainingSetup:
    return xp.TrainingSetup(
        setup.model, setup.optimizer, {**setup.loaders, "eval": tiny_loader(n=48, seed=7)}
    )


def accuracy(run: xp.Run) -> float:
    """One evaluation function for every pipeline: run.batches and run.evaluating do the rest."""
    correct, total = torch.zeros((), dtype=torch.long, device=run.device), 0
    with run.evaluating():
        for x, y in run.batches("eval"):
            correct += (run.model(x).argmax(1) == y).sum()
            total += len(y)
    return int(correct) / total


@pytest.fixture(scope="module")
def eager_accuracy():
    setup = with_eval(tiny_setup())
    model, opt = setup.model, setup.optimizer
    for batch in setup.loaders["train"]:
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    with torch.no_grad():
        hits = sum(int((model(x).argmax(1) == y).sum()) for x, y in setup.loaders["eval"])
    return hits / 48


@pytest.mark.parametrize("subset", VALID, ids=ids)
def test_one_evaluation_function_gives_the_same_accuracy_under_every_pipeline(subset, eager_accuracy):
    with xp.session(xp.Pipeline(*subset)(with_eval(tiny_setup()))) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        assert run.model.training
        got = accuracy(run)
        assert run.model.training  # evaluating() put train mode back
    assert got == eager_accuracy


def test_evaluating_sets_aside_the_recompile_guard_and_runs_what_it_traced():
    pipeline = xp.Pipeline(
        xp.with_device(), xp.wrap_loader_mp(), xp.recompile_guard(warmup=1, action="raise")
    )
    setup = with_eval(tiny_setup())
    with xp.session(pipeline(setup)) as run:
        for _ in range(2):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
            accuracy(run)  # new graphs, on purpose: never held against training
            with run.evaluating():  # pending work left in the block is run at its end, not later
                run.model(torch.randn(3, 8, device=run.device)).sum()
        assert events(run) == []


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    note: str = "kept"


@pytest.mark.parametrize("kind", [Pair, Batch])
@pytest.mark.parametrize("loader_mp", [False, True])
def test_named_tuple_and_dataclass_batches_move_with_and_without_the_device_loader(kind, loader_mp):
    batches = [kind(x, y) for x, y in tiny_loader()]
    model = tiny_model()
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": batches})
    pipeline = xp.Pipeline(xp.with_device(), *([xp.wrap_loader_mp()] if loader_mp else []))
    with xp.session(pipeline(setup)) as run:
        seen = []
        for batch in run.batches("train"):
            assert type(batch) is kind and batch.x.device.type == "xla"
            seen.append(float(run.step(batch, lambda m, b: nn.functional.cross_entropy(m(b.x), b.y))))
    assert len(seen) == 4
    if kind is Batch:
        assert xp.to_device(batches[0], torch.device("cpu")).note == "kept"


def tied_model() -> nn.Module:
    torch.manual_seed(0)
    embed, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    return nn.Sequential(embed, head)


def token_loss(model, batch):
    return nn.functional.cross_entropy(model(batch), batch)


@pytest.mark.parametrize("downcast", [False, True])
def test_the_trained_weights_come_back_to_the_users_model_with_ties_and_dtypes(downcast):
    model = tied_model()
    before = model[0].weight.detach().clone()
    setup = xp.TrainingSetup(
        model,
        lambda ps: torch.optim.SGD(ps, lr=0.5),
        {"train": [torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(i)) for i in range(4)]},
    )
    pipeline = xp.Pipeline(xp.with_device(), *([xp.with_precision("bf16", "downcast")] if downcast else []))
    with xp.session(pipeline(setup)) as run:
        for batch in run.batches("train"):
            run.step(batch, token_loss)
        trained = run.state_dict()
    assert trained["0.weight"] is trained["1.weight"]  # one tensor for the tied pair
    assert trained["0.weight"].device.type == "cpu" and trained["0.weight"].dtype == torch.float32
    assert torch.equal(model[0].weight, before)  # nothing changed until asked
    assert run.copy_weights_to() is model  # after the session: the user's model by default
    assert model[0].weight is model[1].weight and model[0].weight.dtype == torch.float32
    assert torch.equal(model[0].weight.detach(), trained["0.weight"])
    assert not torch.equal(model[0].weight.detach(), before)
    other = nn.Sequential(nn.Embedding(10, 5), nn.Linear(5, 10, bias=False))
    with pytest.raises(ValueError, match="shapes differ"):
        run.copy_weights_to(other)


def test_a_run_refuses_to_step_after_its_session():
    with xp.session(xp.with_device()(tiny_setup())) as run:
        batch = next(iter(run.loaders["train"]))
        run.step(batch, loss_fn)
    with pytest.raises(RuntimeError, match="this run's session has ended"):
        run.step(batch, loss_fn)
    with pytest.raises(RuntimeError, match="this run's session has ended"):
        next(run.batches("train"))


def test_device_loaders_of_two_runs_and_two_loops_never_cut_each_other_short():
    setup = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(tiny_setup())
    with xp.session(setup) as first:
        with xp.session(setup) as second:
            assert first.loaders["train"] is not second.loaders["train"]
            pairs = list(zip(first.loaders["train"], first.loaders["train"]))  # two loops of one loader
            assert len(pairs) == 4
            assert all(torch.equal(a[0].cpu(), b[0].cpu()) for a, b in pairs)
            assert len(list(second.loaders["train"])) == 4
        assert len(list(first.loaders["train"])) == 4  # the second session's exit closed only its own


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda m, b: 1.5, TypeError, "returned a float"),
        (lambda m, b: None, TypeError, "returned a NoneType"),
        (
            lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1], reduction="none"),
            ValueError,
            "must be a scalar",
        ),
        (lambda m, b: loss_fn(m, b).detach(), ValueError, "does not depend on any trainable parameter"),
    ],
)
def test_a_loss_function_that_returns_no_usable_loss_gets_a_clear_error(bad, error, message):
    with xp.session(xp.with_device()(tiny_setup())) as run:
        with pytest.raises(error, match=message):
            run.step(next(iter(run.loaders["train"])), bad)


def test_sessions_that_end_out_of_order_leave_the_default_dtype_as_it_was():
    first = xp.set_default_tensor_type("float64")(tiny_setup())
    second = xp.set_default_tensor_type("float16")(tiny_setup())
    a, b = xp.session(first), xp.session(second)
    a.__enter__()
    b.__enter__()
    assert torch.get_default_dtype() == torch.float16
    a.__exit__(None, None, None)  # the first ends first: the second's setting stays in force ...
    assert torch.get_default_dtype() == torch.float16
    b.__exit__(None, None, None)  # ... and when it ends, both are undone
    assert torch.get_default_dtype() == torch.float32


def test_a_model_already_on_the_device_is_refused_without_with_device():
    setup = tiny_setup()
    moved = xp.TrainingSetup(setup.model.to("xla:0"), None)
    with pytest.raises(
        ValueError, match="the model's weights are on the XLA device, and the pipeline has no with_device"
    ):
        with xp.session(moved):
            pass


STARTUP = """
import sys, torch, xlapipe as xp
sys.path.insert(0, {tests!r})
from helpers import tiny_setup, train_losses
bf16 = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"))
train_losses(bf16(tiny_setup()))
train_losses(bf16(tiny_setup()))  # the same start-up variable: fine
try:
    train_losses(xp.with_device()(tiny_setup()))
except RuntimeError as error:
    print("REFUSED", error)
"""


def test_a_session_that_contradicts_the_runtimes_start_up_precision_is_refused():
    import os

    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    env.pop("XLA_USE_BF16", None)
    out = subprocess.run(
        [sys.executable, "-c", STARTUP.format(tests=os.path.dirname(__file__))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED this process's XLA runtime started with XLA_USE_BF16=1" in out.stdout


def test_a_failed_session_releases_its_device_tensors():
    import gc
    import weakref

    def failing(model, batch):
        loss_fn(model, batch).backward()  # pending device work, then the user's code fails
        raise ArithmeticError("the user's step failed")

    with pytest.raises(ArithmeticError):
        with xp.session(xp.with_device()(tiny_setup())) as run:
            weights = weakref.ref(next(run.model.parameters()))
            run.step(next(iter(run.loaders["train"])), failing)
    gc.collect()
    assert weights() is None  # released on exit, though `run` is still in scope
    with pytest.raises(RuntimeError, match="session has ended"):
        run.step(None, loss_fn)
    assert train_losses_of(xp.with_device()(tiny_setup()))  # and the next session trains


def train_losses_of(setup):
    with xp.session(setup) as run:
        return [float(run.step(b, loss_fn)) for b in run.batches("train")]


def test_an_evaluation_loop_runs_one_graph_per_batch_not_one_growing_graph():
    import torch_xla.debug.metrics as met

    def executions():
        data = met.metric_data("ExecuteTime")
        return int(data[0]) if data else 0

    with xp.session(xp.with_device()(with_eval(tiny_setup()))) as run:
        total = torch.zeros((), device=run.device)
        run.model(torch.zeros(48, 8, device=run.device)).sum()  # compile the forward's graphs first
        with run.evaluating():
            for x, _ in run.batches("eval"):
                total = total + run.model(x).sum()
        before = executions()
        with run.evaluating():
            for x, _ in run.batches("eval"):
                total = total + run.model(x).sum()
        assert executions() - before == 3  # 48 examples in batches of 16: a graph (and marker) each


def test_the_run_says_whether_the_last_micro_batch_updated():
    with xp.session(xp.Pipeline(xp.with_device(), xp.accumulate_grad(3))(tiny_setup())) as run:
        updated = []
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            updated.append(run.updated)
        assert updated == [False, False, True, False] and run.updates == 2  # the rest applied at the end


def eager_skipping(bad: set[int], window: int = 4) -> list[torch.Tensor]:
    setup = tiny_setup()
    batches = [b for i, b in enumerate(tiny_loader(n=112)) if i not in bad]
    for start in range(0, len(batches), window):
        setup.optimizer.zero_grad()
        part = batches[start : start + window]
        for batch in part:
            (loss_fn(setup.model, batch) / len(part)).backward()
        setup.optimizer.step()
    return [p.detach() for p in setup.model.parameters()]


def test_a_failed_step_leaves_the_accumulation_window_as_it_was():
    # The failed step zeroed the window's gradients but kept its count (0.0113 from "skip the bad batch").
    def broken(model, batch):
        loss_fn(model, batch).backward()  # half a step: gradients written, then it fails
        raise RuntimeError("a bad batch")

    setup = tiny_setup().evolve(loaders={"train": tiny_loader(n=112)})
    with xp.session(xp.Pipeline(xp.with_device(), xp.accumulate_grad(4))(setup)) as run:
        for i, batch in enumerate(run.batches("train")):
            try:
                run.step(batch, broken if i == 2 else loss_fn)
            except RuntimeError:
                assert run.window == 2
        got = [p.detach().cpu() for p in run.model.parameters()]
    for g, w in zip(got, eager_skipping({2})):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@frozen
class InterruptAfterUpdate(xp.Hook):
    """Sends Ctrl-C (a real SIGINT) in the middle of the second update."""

    def start(self, run):
        return _Interrupting(run)


class _Interrupting(xp.Hook):
    def __init__(self, run):
        self.run = run

    def on_gradients(self):
        if self.run.updates == 1:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_keeps_the_weights_of_the_last_completed_step():
    # Before, the trained weights were thrown away and the error blamed the model's architecture.
    eager = tiny_setup()
    for batch in list(eager.loaders["train"])[:2]:
        eager.optimizer.zero_grad()
        loss_fn(eager.model, batch).backward()
        eager.optimizer.step()
    setup = tiny_setup()
    interrupting = xp.Transform("interrupt", hooks=(InterruptAfterUpdate(),))
    with pytest.raises(KeyboardInterrupt):
        with xp.session(xp.Pipeline(xp.with_device(), interrupting)(setup)) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
    assert run.steps == 1  # the interrupt came during step 2's update, held until it was traced whole
    run.copy_weights_to()
    for mine, want in zip(setup.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-6)


@frozen
class FailsToClose(xp.Hook):
    def close(self):
        raise RuntimeError("the second error")


def test_an_error_while_closing_never_hides_the_first():
    failing = xp.Transform("fails_to_close", hooks=(FailsToClose(),))
    with pytest.raises(ZeroDivisionError) as raised:
        with xp.session(xp.Pipeline(xp.with_device(), failing)(tiny_setup())):
            1 / 0  # noqa: B018
    assert "while closing the session after it: RuntimeError: the second error" in "".join(
        getattr(raised.value, "__notes__", [])
    )
