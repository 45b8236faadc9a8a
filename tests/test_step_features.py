"""Accumulation, clipping, a scheduler and logging, under every fp32 subset of the five practices,
against the same features written by hand in eager PyTorch on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch_xla.debug.metrics as met
from torch import nn

import xlapipe as xp
from helpers import loss_fn, tiny_setup
from test_equivalence import VALID, ids

RECORDS: list[dict] = []


def collect(record: dict) -> None:
    """log_every's sink in these tests (importable: the pipeline stays describable)."""
    RECORDS.append(record)


def halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def eager(optimizer: str, accumulate: int, clip: float | None, scheduler, epochs: int = 2):
    """The hand-written loop: accumulate, average, clip, step, schedule; epochs end a window."""
    setup = tiny_setup(optimizer)
    model, opt = setup.model, setup.optimizer
    sched = scheduler(opt) if scheduler else None
    losses, norms, lrs = [], [], []
    for _ in range(epochs):
        batches = list(setup.loaders["train"])
        pending = 0
        for i, batch in enumerate(batches):
            loss = loss_fn(model, batch)
            loss.backward()
            losses.append(loss.item())
            pending += 1
            if pending == accumulate or i == len(batches) - 1:
                for p in model.parameters():
                    p.grad.mul_(1.0 / pending)
                if clip is not None:
                    norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
                opt.step()
                opt.zero_grad()
                pending = 0
                if sched is not None:
                    sched.step()
                lrs.append(opt.param_groups[0]["lr"])
    return losses, norms, lrs, [p.detach().clone() for p in model.parameters()]


def with_xlapipe(subset, optimizer: str, accumulate: int, clip: float | None, scheduler, epochs: int = 2):
    base = tiny_setup(optimizer)
    setup = xp.TrainingSetup(base.model, base.optimizer, base.loaders, scheduler=scheduler)
    extra = (
        ([xp.accumulate_grad(accumulate)] if accumulate > 1 else [])
        + ([xp.clip_grad_norm(clip)] if clip is not None else [])
        + [xp.log_every(1, to=collect)]
    )
    RECORDS.clear()
    with xp.session(xp.Pipeline(*subset, *extra)(setup)) as run:
        for _ in range(epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        weights = [p.detach().cpu() for p in run.model.parameters()]
        updates = run.updates
    records = list(RECORDS)
    updated = [r for prev, r in zip([{"updates": 0}] + records, records) if r["updates"] > prev["updates"]]
    return (
        [r["loss"] for r in records],
        [r["grad_norm"] for r in records if "grad_norm" in r],
        [r["lr"] for r in updated],
        weights,
        updates,
    )


def close(got, want, rel=1e-5):
    assert len(got) == len(want) > 0, (got, want)
    for g, w in zip(got, want):
        assert abs(g - w) <= rel * max(abs(w), 1e-6), (got, want)


FEATURES = {
    "accumulate": dict(accumulate=2, clip=None, scheduler=None),
    "clip": dict(accumulate=1, clip=0.05, scheduler=None),
    "schedule": dict(accumulate=1, clip=None, scheduler=halving),
    "all": dict(accumulate=2, clip=0.05, scheduler=halving),
}


@pytest.mark.parametrize("subset", VALID, ids=ids)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_feature_matches_eager_under_every_fp32_subset(subset, optimizer, feature):
    options = FEATURES[feature]
    want_losses, want_norms, want_lrs, want_weights = eager(optimizer, **options)
    losses, norms, lrs, weights, updates = with_xlapipe(subset, optimizer, **options)
    close(losses, want_losses)
    assert updates == len(want_lrs) == 8 // options["accumulate"]
    if options["clip"] is not None:
        close(norms, want_norms)
        assert min(want_norms) > options["clip"]  # the clipping really clipped
    close(lrs, want_lrs, rel=1e-12)
    for got, want in zip(weights, want_weights):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_epoch_that_ends_inside_a_window_applies_what_it_has():
    want = eager("adamw", accumulate=3, clip=None, scheduler=halving)
    got = with_xlapipe(
        (xp.with_device(), xp.wrap_loader_mp()), "adamw", accumulate=3, clip=None, scheduler=halving
    )
    assert got[4] == len(want[2]) == 4  # 4 batches an epoch: a full window of 3, then one of 1
    for g, w in zip(got[3], want[3]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_gradients_never_applied_are_reported_and_name_the_fix():
    setup = xp.Pipeline(xp.with_device(), xp.accumulate_grad(3))(tiny_setup())
    with pytest.warns(xp.PendingGradientsWarning, match=r"1 micro-batch.*run.end_epoch\(\)"):
        with xp.session(setup) as run:
            batches = list(run.loaders["train"])
            for batch in batches:  # not run.batches(): nobody tells the run the epoch ended
                run.step(batch, loss_fn)
            assert (run.steps, run.updates, run.window) == (4, 1, 1)


def executions() -> int:
    data = met.metric_data("ExecuteTime")
    return int(data[0]) if data else 0


@pytest.mark.parametrize("loader_mp", [False, True], ids=["own-marker", "wrap_loader_mp"])
def test_logging_every_step_executes_no_more_graphs_than_not_logging(loader_mp):
    def count(log: bool) -> tuple[int, int]:
        RECORDS.clear()
        pipeline = xp.Pipeline(
            xp.with_device(),
            *([xp.wrap_loader_mp()] if loader_mp else []),
            xp.clip_grad_norm(1.0),
            *([xp.log_every(1, to=collect)] if log else []),
        )
        before = executions()
        with xp.session(pipeline(tiny_setup())) as run:
            for _ in range(3):
                for batch in run.batches("train"):
                    run.step(batch, loss_fn)
        return executions() - before, len(RECORDS)

    count(False)  # compile both graphs first
    plain, _ = count(False)
    logged, records = count(True)
    assert records == 12 and plain == logged >= 12


def test_reading_the_loss_every_step_would_execute_more():
    # The control for the test above: float(loss) before the marker is an extra execution.
    pipeline = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
    with xp.session(pipeline(tiny_setup())) as run:
        batches = run.batches("train")
        run.step(next(batches), loss_fn)
        before = executions()
        for batch in batches:
            float(run.step(batch, loss_fn))
    assert executions() - before >= 2 * 3 - 1


def test_scheduler_on_the_users_optimizer_is_refused_and_a_scheduler_factory_is_built_on_the_runs():
    setup = tiny_setup()
    torch.optim.lr_scheduler.StepLR(setup.optimizer, step_size=1)
    with pytest.raises(ValueError, match="scheduler was built on the optimizer in this setup"):
        with xp.session(xp.with_device()(setup)):
            pass
    setup = tiny_setup()
    with xp.session(
        xp.with_device()(xp.TrainingSetup(setup.model, setup.optimizer, setup.loaders, scheduler=halving))
    ) as run:
        assert run.scheduler.optimizer is run.optimizer
    with pytest.raises(TypeError, match="scheduler must be a function of the optimizer"):
        xp.TrainingSetup(setup.model, setup.optimizer, scheduler=halving(setup.optimizer))


def test_the_runs_scheduler_is_saved_and_restored(tmp_path):
    def run_epochs(epochs, restore=None, save=None):
        base = tiny_setup("adamw")
        setup = xp.Pipeline(xp.with_device())(
            xp.TrainingSetup(base.model, base.optimizer, base.loaders, scheduler=halving)
        )
        with xp.session(setup) as run:
            if restore:
                xp.checkpoint.restore(restore, run)
            for _ in range(epochs):
                for batch in run.batches("train"):
                    run.step(batch, loss_fn)
            if save:
                xp.checkpoint.save(save, run, step=run.steps)
            return run.optimizer.param_groups[0]["lr"], run.steps, run.updates

    straight = run_epochs(2)
    run_epochs(1, save=tmp_path / "c.pt")
    assert run_epochs(1, restore=tmp_path / "c.pt") == straight == (0.01 * 0.5**8, 8, 8)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: xp.accumulate_grad(0), "steps must be a positive int"),
        (lambda: xp.clip_grad_norm(0.0), "max_norm must be a positive finite number"),
        (
            lambda: xp.clip_grad_norm(1.0, norm_type="l2"),
            "norm_type must be a positive finite number, or 'inf'",
        ),
        (lambda: xp.log_every(0), "every must be a positive int"),
        (lambda: xp.log_every(5, to="stdout"), "to must be 'print', 'progress', 'module:function'"),
    ],
)
def test_bad_parameters_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_a_lambda_sink_trains_but_cannot_be_described():
    pipeline = xp.Pipeline(xp.log_every(2, to=lambda record: None))
    with pytest.raises(TypeError, match="define it at the top level of an importable module"):
        pipeline.describe()
    assert xp.Pipeline(xp.log_every(2, to=collect)).describe() == [
        {"name": "log_every", "params": {"every": 2, "to": "test_step_features:collect"}}
    ]
