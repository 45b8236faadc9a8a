"""A practice written the way docs/design.md teaches, tested the way it teaches (xlapipe.testing)."""

from __future__ import annotations

import os

from hypothesis import given, settings

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_setup
from workloads.smoothed_loss import smoothed, smoothed_loss
from xlapipe import checkpoint, testing

HERE = os.path.dirname(os.path.abspath(__file__))
POOL = testing.pool(
    xp.with_device(), xp.wrap_loader_mp(), xp.accumulate_grad(2), smoothed_loss(), smoothed_loss(0.9)
)


@settings(max_examples=50, deadline=None)
@given(testing.orderings(POOL))
def test_smoothed_loss_obeys_the_laws(transforms):
    testing.check_laws(transforms, tiny_setup)


def uneven_setup() -> xp.TrainingSetup:
    """Seven batches: each epoch ends inside an accumulation window of three."""
    setup = tiny_setup("adamw")
    return xp.TrainingSetup(setup.model, setup.optimizer, {"train": tiny_loader(n=112)})


def test_smoothed_loss_trains_the_same_wherever_it_is_listed():
    testing.check_listing_trains_identically(smoothed_loss(0.9), uneven_setup, loss_fn)


def test_smoothed_loss_is_the_eager_average_and_resumes_exactly(tmp_path):
    losses, average, seen = [], 0.0, 0.0
    setup = tiny_setup("sgd")
    for batch in setup.loaders["train"]:
        setup.optimizer.zero_grad()
        loss = loss_fn(setup.model, batch)
        loss.backward()
        setup.optimizer.step()
        average, seen = 0.9 * average + 0.1 * loss.item(), 0.9 * seen + 0.1
        losses.append(average / seen)
    pipeline = xp.Pipeline(xp.with_device(), smoothed_loss(0.9))
    with xp.session(pipeline(tiny_setup("sgd"))) as run:
        for i, batch in enumerate(run.batches("train")):
            run.step(batch, loss_fn)
            if i == 1:
                checkpoint.save(tmp_path / "c.pt", run, step=run.steps)
        straight = float(smoothed(run))
    assert abs(straight - losses[-1]) < 1e-6
    with xp.session(pipeline(tiny_setup("sgd", seed=5))) as run:
        checkpoint.restore(tmp_path / "c.pt", run)
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        assert float(smoothed(run)) == straight


def test_state_is_restored_after_a_failing_session_with_the_practice():
    testing.check_session_restores_state(xp.Pipeline(xp.with_device(), smoothed_loss())(tiny_setup()))


def test_docs_show_the_practice_as_it_is():
    with open(os.path.join(HERE, "..", "docs", "design.md")) as f:
        page = f.read()
    with open(os.path.join(HERE, "workloads", "smoothed_loss.py")) as f:
        module = f.read()
    shown = page.split("## Writing a practice")[1].split("```python\n")[1].split("```")[0]
    assert shown.strip() and shown in module


def test_its_claim_declared_as_the_docs_show_is_held_by_the_harness():
    # docs/design.md, "Its claims, held by the harness": the user's door to the whole battery.
    from xlapipe import claims
    from xlapipe.claims import Claim, Reference
    from xlapipe.testing import harness, zoo

    page = open(os.path.join(HERE, "..", "docs", "design.md")).read()
    assert 'claims.declare(Claim(\n    "smoothed_loss",' in page
    claim = claims.declare(
        Claim(
            "smoothed_loss",
            lambda: smoothed_loss(0.9),
            summary="the logged loss smoothed; training unchanged",
            reference=lambda t: Reference(),
        )
    )
    try:
        for law in ("trains_as_eager", "resumes:mid_window", "preempted"):
            kind, _, point = law.partition(":")
            harness.check_claim(claim, zoo.case("unused_branch"), kind, point or "mid_epoch")
    finally:
        del claims.CLAIMS["smoothed_loss"]  # the built-ins' table and test_claims know only theirs
