"""A practice written the way docs/design.md teaches, tested the way it teaches (xlapipe.testing)."""

from __future__ import annotations

import os

import torch
from hypothesis import given, settings

import xlapipe as xp
from helpers import loss_fn, tiny_setup
from workloads.ema_practice import averaged_weights, ema_weights
from xlapipe import testing

HERE = os.path.dirname(os.path.abspath(__file__))
POOL = testing.pool(
    xp.with_device(), xp.wrap_loader_mp(), xp.accumulate_grad(2), ema_weights(), ema_weights(0.9)
)


@settings(max_examples=50, deadline=None)
@given(testing.orderings(POOL))
def test_ema_weights_obeys_the_laws(transforms):
    testing.check_laws(transforms, tiny_setup)


def test_ema_weights_averages_what_eager_pytorch_averages():
    reference = tiny_setup("sgd")
    model, opt = reference.model, reference.optimizer
    average = [p.detach().clone() for p in model.parameters()]
    for batch in reference.loaders["train"]:
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
        for a, p in zip(average, model.parameters()):
            a.mul_(0.9).add_(p.detach(), alpha=0.1)
    with xp.session(xp.Pipeline(xp.with_device(), ema_weights(0.9))(tiny_setup("sgd"))) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        got = [a.cpu() for a in averaged_weights(run)]
    for g, w in zip(got, average):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_state_is_restored_after_a_failing_session_with_the_practice():
    testing.check_session_restores_state(xp.Pipeline(xp.with_device(), ema_weights())(tiny_setup()))


def test_docs_show_the_practice_as_it_is():
    with open(os.path.join(HERE, "..", "docs", "design.md")) as f:
        page = f.read()
    with open(os.path.join(HERE, "workloads", "ema_practice.py")) as f:
        module = f.read()
    shown = page.split("## Writing a practice")[1].split("```python\n")[1].split("```")[0]
    assert shown.strip() and shown in module
