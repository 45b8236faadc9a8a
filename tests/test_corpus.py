"""Real public training scripts, ported (tests/corpus): every path they take is as right as the examples.

For each script and each practice subset it can take (corpus/matrix.py):

- the port trains like the script itself in eager PyTorch on the CPU: every
  step's loss, the final weights, ema's average (kept by hand in the eager
  loop), what its evaluation prints and where it writes checkpoints, within a
  relative 1e-5 (fp32);
- the script stopped right after its first checkpoint (inside an epoch) and
  started again in a new session continues bit for bit like the uninterrupted
  port: the same losses, weights and average, exactly;
- where xlapipe refuses that checkpoint, or the training itself, the refusal is
  asserted, with its reason.

The CI slice (each script with its richest subset) runs by default; the whole
matrix is marked ``corpus_full`` and runs with ``--corpus-full`` (``make corpus``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import xlapipe as xp
from corpus import nanogpt
from corpus.common import Result, option
from corpus.matrix import ALL, SLICE, Case

# Losses and evaluations: relative 1e-5 each. Weights: relative 1e-5 of each tensor's norm. Not
# elementwise: AdamW divides each update by the root of its second moment, so a weight whose
# gradients are tiny moves by a step whose size fp32 rounding decides; measured on nanoGPT's GPT after
# 7 updates: 1.6e-6 of the norm at most, 1.3e-6 absolute, 3e-3 relative for weights near zero.
RTOL = 1e-5
# And an absolute 1e-6 per element (root mean square) for tensors that hold only rounding noise:
# BERT's attention key biases get no gradient (softmax ignores a shift common to all keys), so AdamW
# moves them by noise alone; measured: 5e-8 apart, 1.2 times their norm.
ATOL = 1e-6

_EAGER: dict = {}


def eager(case: Case, args, folder) -> Result:
    """The script in eager PyTorch (one run per distinct set of options: many subsets share it)."""
    key = (case.script, args)
    if key not in _EAGER:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # two cores shared with XLA's threads: one is steady (test_examples.py)
        try:
            _EAGER[key] = case.module.eager(in_folder(case, args, folder))
        finally:
            torch.set_num_threads(threads)
    return _EAGER[key]


def in_folder(case: Case, args, folder):
    return dataclasses.replace(args, **{case.module.FOLDER: str(folder)})


def assert_close_state(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for key in want:
        a, b = got[key].double(), want[key].double()
        error = float((a - b).norm())
        assert error <= RTOL * float(b.norm()) + ATOL * b.numel() ** 0.5, (
            f"{what}: {key} off by {error / max(float(b.norm()), 1e-30):.3g} of its norm "
            f"(largest difference {float((a - b).abs().max()):.3g})"
        )


def assert_same_state(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for key in want:
        assert torch.equal(got[key], want[key]), (
            f"{what}: {key} differs by {float((got[key].double() - want[key].double()).abs().max()):.3g}"
        )


def assert_matches_eager(got: Result, want: Result) -> None:
    assert len(got.losses) == len(want.losses), (len(got.losses), len(want.losses))
    np.testing.assert_allclose(got.losses, want.losses, rtol=RTOL, atol=0, err_msg="per-step losses")
    np.testing.assert_allclose(got.evals, want.evals, rtol=RTOL, atol=0, err_msg="evaluation")
    assert got.saves == want.saves

    assert_close_state(got.weights, want.weights, "final weights")
    assert (got.average is None) == (want.average is None)
    if want.average is not None:
        assert_close_state(got.average, want.average, "ema's average")


def check_case(case: Case, tmp_path) -> None:
    module, pipeline = case.module, case.pipeline
    args = module.args_for(pipeline)
    refused = case.refused_save
    compared = module.without_checkpoints(args) if refused else args
    want = eager(case, compared, tmp_path / "eager")
    max_norm = option(pipeline, "clip_grad_norm", "max_norm")
    if max_norm is not None:
        # The clipping is not idle: at least one update's gradients were longer than the limit.
        assert max(want.norms) > max_norm, want.norms
    if case.refused_run:
        with pytest.raises(xp.CompileStepError, match=case.refused_run):
            module.ported(pipeline, in_folder(case, compared, tmp_path / "straight"))
        return
    straight = module.ported(pipeline, in_folder(case, compared, tmp_path / "straight"))
    assert_matches_eager(straight, want)
    if case.script == "mnist":
        # log_every(log_steps): the script's cadence, counted from 1 across epochs; the losses it was handed.
        every = module.Flags.log_steps
        assert [r["step"] for r in straight.logged] == list(range(every, len(straight.losses) + 1, every))
        assert [r["loss"] for r in straight.logged] == [
            straight.losses[r["step"] - 1] for r in straight.logged
        ]

    saving = str(tmp_path / "saving")
    if refused:
        with pytest.raises(ValueError, match=refused):
            module.ported(pipeline, module.interrupted(args, saving))
        return
    first = module.ported(pipeline, module.interrupted(args, saving))
    k = module.resume_point(args)
    assert len(first.losses) == k and first.saves == straight.saves[:1]
    assert first.losses == straight.losses[:k]
    rest = module.ported(pipeline, module.resumed(args, saving))  # a new session, a new model
    # Bit for bit: the same graphs cut at the same steps (a save ends the pending step, as the
    # step marker after every step does anyway).
    assert rest.losses == straight.losses[k:]
    assert rest.evals == straight.evals[len(straight.evals) - len(rest.evals) :]
    assert_same_state(rest.weights, straight.weights, "weights after the resume")
    if straight.average is not None:
        assert_same_state(rest.average, straight.average, "ema's average after the resume")


PARAMS = [
    pytest.param(case, id=case.id, marks=() if case in SLICE else pytest.mark.corpus_full) for case in ALL
]


@pytest.mark.parametrize("case", PARAMS)
def test_port_trains_like_the_script_and_resumes_exactly(case, tmp_path):
    check_case(case, tmp_path)


def test_the_slice_is_part_of_the_matrix_and_the_matrix_is_whole():
    assert all(case in ALL for case in SLICE)
    counts = {script: sum(c.script == script for c in ALL) for script in ("nanogpt", "glue", "mnist")}
    assert counts == {"nanogpt": 2 * 2 * 4 * 2, "glue": 2 * 2 * 2 * 2 * 3, "mnist": 2 * 3 * 2}
    assert len({c.id for c in ALL}) == len(ALL)


def test_nanogpts_own_resume_is_not_exact_which_the_port_fixes(tmp_path):
    """Why the port carries more than train.py's checkpoint dict: the script's resume seeds torch's
    generator with 1337 again and drops the batch it had fetched, so it trains on other batches
    than the uninterrupted run (the port's checkpoint keeps the generators and the batch)."""
    cfg = nanogpt.Config(out_dir=str(tmp_path / "straight"))
    straight = nanogpt.eager(cfg)
    first = nanogpt.eager(nanogpt.interrupted(cfg, str(tmp_path / "saving")))
    rest = nanogpt.eager(nanogpt.resumed(cfg, str(tmp_path / "saving")))
    k = nanogpt.resume_point(cfg)
    assert first.losses == straight.losses[:k]
    assert len(rest.losses) == len(straight.losses) - k
    assert rest.losses != straight.losses[k:]


def test_mnist_batch_norm_running_statistics_are_eagers(tmp_path):
    """torch_xla 2.9's kernel folds the biased batch variance into running_var (1e-4 of its norm off
    after these 10 steps); with_device installs PyTorch's update for the session."""
    case = Case("mnist", ())
    args = case.module.args_for(case.pipeline)
    want = eager(case, args, tmp_path / "eager")
    got = case.module.ported(case.pipeline, in_folder(case, args, tmp_path / "ported"))
    np.testing.assert_allclose(got.losses, want.losses, rtol=RTOL, atol=0)
    for key in ("bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"):
        assert_close_state(
            {key: got.weights[key]}, {key: want.weights[key]}, "BatchNorm's running statistics"
        )
