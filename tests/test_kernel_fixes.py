"""Corrected XLA kernels: batch norm on the device keeps eager PyTorch's running statistics."""

import numpy as np
import pytest
import torch
import torch_xla
from torch import nn

import xlapipe as xp
from helpers import tiny_loader
from xlapipe import kernel_fixes


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def bn_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def eager_run() -> tuple[list[float], dict]:
    model = bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for batch in tiny_loader():
        opt.zero_grad()
        loss = bn_loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compile_step"])
def test_batch_norm_on_the_device_trains_eagers_numbers(compiled):
    want_losses, want = eager_run()
    model = bn_model()
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), {"train": tiny_loader()}
    )
    pipeline = xp.Pipeline(xp.with_device(), *([xp.compile_step()] if compiled else []))
    with xp.session(pipeline(setup)) as run:
        losses = [float(run.step(b, bn_loss)) for b in run.loaders["train"]]
        got = run.state_dict()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for key in ("1.running_mean", "1.running_var", "1.weight", "3.weight"):
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
    assert int(got["1.num_batches_tracked"]) == int(want["1.num_batches_tracked"]) == 4


@pytest.mark.parametrize("op", ["native_batch_norm", "_native_batch_norm_legit"])  # lazy, dynamo
def test_the_corrected_kernel_lasts_as_long_as_the_session_also_when_the_body_raises(op):
    # torch_xla 2.9 folds the biased variance in; when an upgrade fixes it, the probe says so and
    # this test fails: then the corrected kernel can go.
    assert not kernel_fixes.torch_xla_batch_norm_is_unbiased(op)
    assert kernel_fixes.running_var_of_one_batch(op) == pytest.approx(1.0)
    setup = xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))
    with pytest.raises(KeyError):
        with xp.session(setup):
            assert kernel_fixes.running_var_of_one_batch(op) == pytest.approx(2.0)  # PyTorch's: unbiased
            raise KeyError("the user's code fails")
    assert kernel_fixes.running_var_of_one_batch(op) == pytest.approx(1.0)  # torch_xla's kernel is back
    assert {"effect": "correct_batch_norm", "device": "xla"} in [e.describe() for e in setup.effects]


def test_overlapping_sessions_share_the_corrected_kernel_until_the_last_one_ends():
    first = xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model())))
    second = xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model())))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first ends while the second still needs the kernel
    assert kernel_fixes.running_var_of_one_batch("native_batch_norm") == pytest.approx(2.0)
    second.__exit__(None, None, None)
    assert kernel_fixes.running_var_of_one_batch("native_batch_norm") == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["autocast", "downcast"])
def test_batch_norm_in_bf16_trains_close_to_eager(mode):
    """The corrected kernel hands its backward the saved statistics in the input's dtype, as torch_xla's does."""
    want_losses, want = eager_run()
    model = bn_model()
    setup = xp.TrainingSetup(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), {"train": tiny_loader()}
    )
    with xp.session(xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode=mode))(setup)) as run:
        losses = [float(run.step(b, bn_loss)) for b in run.loaders["train"]]
        got = run.state_dict()
    np.testing.assert_allclose(losses, want_losses, rtol=3e-2)
    np.testing.assert_allclose(
        got["1.running_var"].numpy(), want["1.running_var"].numpy(), rtol=3e-2, atol=1e-3
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.LayerNorm(16),
        lambda: nn.BatchNorm1d(16, track_running_stats=False),
        lambda: nn.GroupNorm(4, 16),
    ],
    ids=["layer_norm", "batch_norm_without_running_stats", "group_norm"],
)
def test_norms_without_running_statistics_keep_torch_xlas_own_kernel(make):
    """A norm in training without running statistics (batch norm that tracks none; group norm, which
    reaches batch norm over a reshaped input) has nothing to correct: the session's graph is the one
    torch_xla builds without the corrected kernel."""

    def graph(session: bool) -> str:
        torch.manual_seed(0)
        norm = make().to(torch_xla.device())
        x = torch.randn(4, 16).to(torch_xla.device()).requires_grad_()

        def text() -> str:
            norm(x).sum().backward()
            return torch_xla._XLAC._get_xla_tensors_hlo([x.grad])

        if not session:
            return text()
        with xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))):
            return text()

    assert graph(session=True) == graph(session=False)
