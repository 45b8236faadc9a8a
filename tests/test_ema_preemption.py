"""ema and checkpoint_on_preemption: the defects users found (issue 27), each pinned by a test."""

from __future__ import annotations

import os

import pytest
import torch

import xlapipe as xp
from helpers import loss_fn, tiny_setup
from xlapipe import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
EMA = xp.Pipeline(xp.with_device(), xp.ema(0.9))


def equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def trained(run: xp.Run, steps: int = 3) -> None:
    for i, batch in enumerate(run.batches("train")):
        if i == steps:
            break
        run.step(batch, loss_fn)


# -- ema -----------------------------------------------------------------------------------------


def test_a_save_inside_using_averaged_weights_writes_the_model_and_the_average_each_in_its_place(tmp_path):
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        weights, average = run.state_dict(), xp.averaged_weights(run)
        assert not equal(weights, average)
        with xp.using_averaged_weights(run):
            assert equal(run.state_dict(), average)  # the block lends the average to the model
            checkpoint.save(tmp_path / "inside.pt", run, step=run.steps)
            assert equal(run.state_dict(), average)  # and still does after the save
        assert equal(run.state_dict(), weights)
    saved = checkpoint.load(tmp_path / "inside.pt")
    assert equal(saved["model"], weights)
    assert equal(saved["practices"]["ema"]["average"], average)
    # A restore inside the block puts each back in its place too.
    with xp.session(EMA(tiny_setup(seed=5))) as run:
        with xp.using_averaged_weights(run):
            checkpoint.restore(tmp_path / "inside.pt", run)
            assert equal(run.state_dict(), average)
        assert equal(run.state_dict(), weights)
        assert equal(xp.averaged_weights(run), average)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_the_average_is_kept_when_the_session_fails(error):
    with pytest.raises(type(error)):
        with xp.session(EMA(tiny_setup())) as run:
            trained(run)
            average = xp.averaged_weights(run)
            raise error
    assert equal(xp.averaged_weights(run), average)


def test_the_average_is_kept_when_the_session_ends_and_a_run_without_ema_still_says_so():
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        average = xp.averaged_weights(run)
    assert equal(xp.averaged_weights(run), average)
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as plain:
        trained(plain, 1)
    with pytest.raises(ValueError, match=r"keeps no average of its weights: add xlapipe.ema\(decay\)"):
        xp.averaged_weights(plain)
    with pytest.raises(RuntimeError, match="boom"):
        with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as plain:
            raise RuntimeError("boom")
    with pytest.raises(ValueError, match=r"keeps no average of its weights: add xlapipe.ema\(decay\)"):
        xp.averaged_weights(plain)


def test_a_restore_refused_for_another_decay_changes_nothing(tmp_path):
    with xp.session(EMA(tiny_setup())) as run:
        trained(run)
        checkpoint.save(tmp_path / "ema.pt", run, step=run.steps)
    other = xp.Pipeline(xp.with_device(), xp.ema(0.5))
    with xp.session(other(tiny_setup(seed=3))) as run:
        trained(run, 1)
        weights, average, steps = run.state_dict(), xp.averaged_weights(run), run.steps
        with pytest.raises(ValueError, match=r"decay 0.9, this run's is 0.5.*Nothing was changed"):
            checkpoint.restore(tmp_path / "ema.pt", run)
        assert equal(run.state_dict(), weights) and equal(xp.averaged_weights(run), average)
        assert run.steps == steps
    # Replaces test_protocol's test_a_checkpoint_with_practice_state_fits_only_a_run_keeping_it.
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        with pytest.raises(ValueError, match=r"the practices \['ema'\] and this run keeps state for \[\]"):
            checkpoint.restore(tmp_path / "ema.pt", run)


def test_training_inside_using_averaged_weights_is_refused_and_changes_nothing():
    with xp.session(EMA(tiny_setup())) as run:
        trained(run, 1)
        batch = next(iter(run.batches("train")))
        weights, average, steps, epoch = run.state_dict(), xp.averaged_weights(run), run.steps, run.epoch
        with xp.using_averaged_weights(run):
            with pytest.raises(ValueError, match="inside `with xlapipe.using_averaged_weights"):
                run.step(batch, loss_fn)
            with pytest.raises(ValueError, match="inside `with xlapipe.using_averaged_weights"):
                run.end_epoch()
            with pytest.raises(ValueError, match="inside another such block"):
                with xp.using_averaged_weights(run):
                    pass
            assert equal(run.state_dict(), average)
        assert (run.steps, run.epoch) == (steps, epoch)
        assert equal(run.state_dict(), weights) and equal(xp.averaged_weights(run), average)
        run.step(batch, loss_fn)  # outside the block it trains on
        assert run.steps == steps + 1
