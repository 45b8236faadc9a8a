"""Hyperparameters set on the user's own optimizer during a session: followed, or refused with the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_setup


def eager_decaying_rate() -> list[float]:
    setup = tiny_setup("adamw")
    losses = []
    for it, batch in enumerate(setup.loaders["train"]):
        for group in setup.optimizer.param_groups:
            group["lr"] = 1e-2 * 0.5**it
        setup.optimizer.zero_grad()
        loss = loss_fn(setup.model, batch)
        loss.backward()
        setup.optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_rate_set_on_the_users_own_optimizer_takes_effect():
    # nanoGPT sets param_group["lr"] on the optimizer it built; the run trained a copy at the first rate.
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        got = []
        for it, batch in enumerate(run.batches("train")):
            for group in setup.optimizer.param_groups:  # the user's own optimizer
                group["lr"] = 1e-2 * 0.5**it
            got.append(float(run.step(batch, loss_fn)))
        assert run.optimizer.param_groups[0]["lr"] == 1e-2 * 0.5**3
    np.testing.assert_allclose(got, eager_decaying_rate(), rtol=1e-6)


def test_a_rate_set_on_the_users_optimizer_while_the_run_schedules_it_is_refused():
    setup = tiny_setup("adamw").evolve(scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt))
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batches = list(run.batches("train"))
        run.step(batches[0], loss_fn)
        setup.optimizer.param_groups[0]["lr"] = 0.5
        with pytest.raises(ValueError, match="set by its scheduler"):
            run.step(batches[1], loss_fn)


def test_a_value_set_on_both_optimizers_or_a_group_added_is_refused():
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batch = next(iter(run.batches("train")))
        setup.optimizer.param_groups[0]["weight_decay"] = 0.5
        run.optimizer.param_groups[0]["weight_decay"] = 0.25
        with pytest.raises(
            ValueError, match=r"weight_decay of group 0 was set both on your optimizer \(0.5\)"
        ):
            run.step(batch, loss_fn)
    setup = tiny_setup("adamw")
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        setup.optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        with pytest.raises(ValueError, match="parameter groups .* changed during the session"):
            run.step(next(iter(run.batches("train"))), loss_fn)


def test_reduce_on_plateau_is_stepped_by_the_user_with_its_metric():
    plateau = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)  # noqa: E731
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup("adamw").evolve(scheduler=plateau))) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)  # not stepped after updates: it needs a metric
        assert run.optimizer.param_groups[0]["lr"] == 1e-2
        for metric in (1.0, 2.0):
            run.scheduler.step(metric)
        assert run.optimizer.param_groups[0]["lr"] == 5e-3
    # Built on the user's own optimizer and stepped there: it reaches the run too.
    setup = tiny_setup("adamw")
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(setup.optimizer, factor=0.5, patience=0)
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batches = list(run.batches("train"))
        for metric in (1.0, 2.0):
            scheduler.step(metric)
        run.step(batches[0], loss_fn)
        assert run.optimizer.param_groups[0]["lr"] == 5e-3
