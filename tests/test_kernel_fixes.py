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


def test_torch_xlas_elu_gradient_is_still_wrong_and_the_corrected_one_lasts_as_long_as_the_session():
    # torch_xla 2.9 gives 1 + x for x < 0 (its kernel takes the input for the output); when an upgrade
    # fixes it, this test fails and the corrected kernel can go
    assert not kernel_fixes.torch_xla_elu_gradient_is_right()
    assert kernel_fixes.elu_gradient_at(-1.0) == pytest.approx(0.0, abs=1e-6)
    setup = xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))
    with pytest.raises(KeyError):
        with xp.session(setup):
            assert kernel_fixes.elu_gradient_at(-1.0) == pytest.approx(np.exp(-1.0))
            raise KeyError("the user's code fails")
    assert kernel_fixes.elu_gradient_at(-1.0) == pytest.approx(0.0, abs=1e-6)  # torch_xla's is back
    assert {"effect": "correct_elu_gradient", "device": "xla"} in [e.describe() for e in setup.effects]


@pytest.mark.parametrize(
    "activation",
    [
        nn.functional.elu,
        lambda x: nn.functional.elu(x, alpha=2.0),
        lambda x: nn.functional.celu(x, alpha=0.5),
        nn.functional.selu,
        lambda x: nn.functional.selu(x * 1.0, inplace=True),
        lambda x: nn.functional.elu(x * 1.0, inplace=True),
    ],
    ids=["elu", "elu_alpha2", "celu", "selu", "selu_inplace", "elu_inplace"],
)
def test_elu_celu_and_selu_get_eagers_gradient_on_the_device(activation):
    torch.manual_seed(0)
    x = torch.randn(64) * 3  # half of it below 0, where torch_xla's own gradient is wrong
    want = x.clone().requires_grad_()
    activation(want).sum().backward()
    with xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))):
        got = x.to(torch_xla.device()).requires_grad_()
        activation(got).sum().backward()
        torch_xla.sync()
        np.testing.assert_allclose(got.grad.cpu().numpy(), want.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_torch_xlas_max_norm_is_still_wrong_and_the_corrected_one_lasts_as_long_as_the_session():
    # torch_xla 2.9's aten::norm gets p = inf wrong; when an upgrade fixes it, this test fails
    assert not kernel_fixes.torch_xla_max_norm_is_right()
    setup = xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))
    with pytest.raises(KeyError):
        with xp.session(setup):
            assert kernel_fixes.max_norm_of([0.5, -2.0]) == 2.0
            raise KeyError("the user's code fails")
    assert kernel_fixes.max_norm_of([0.5, -2.0]) != 2.0  # torch_xla's is back
    assert {"effect": "correct_norm", "device": "xla"} in [e.describe() for e in setup.effects]


INF = float("inf")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"p": INF},
        {"p": -INF, "dim": 1},
        {"p": INF, "dim": 1, "keepdim": True, "dtype": torch.float32},
        {"p": INF, "dtype": torch.float32},
        {},
        {"p": "fro"},
        {"p": 2, "dim": 1},
        {"p": 1},
        {"p": 3, "dim": 0},
    ],
    ids=["inf", "-inf_dim", "inf_dim_dtype", "inf_dtype", "default", "fro", "2_dim", "1", "3_dim"],
)
def test_norm_on_the_device_gives_eagers_value_and_gradient_for_every_p(kwargs):
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    want = x.clone().requires_grad_()
    want_norm = want.norm(**kwargs)
    want_norm.sum().backward()
    with xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))):
        got = x.to(torch_xla.device()).requires_grad_()
        got_norm = torch.norm(got, **kwargs)
        got_norm.sum().backward()
        torch_xla.sync()
        np.testing.assert_allclose(got_norm.detach().cpu().numpy(), want_norm.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(got.grad.cpu().numpy(), want.grad.numpy(), rtol=1e-5, atol=1e-7)


# What ops_without_gradient lists that is not a differentiable function: out= variants (their overload
# names), torch_xla's own ops, a backward op.
NOT_DIFFERENTIATED = {"_propagate_xla_data", "_to_cpu", "empty.out", "silu_backward"}


def test_the_ops_torch_xla_overrides_without_a_gradient_are_the_ones_decomposed():
    # when a torch_xla release adds or drops one, this fails: WITHOUT_GRADIENT follows it
    listed = {
        name
        for name in kernel_fixes.ops_without_gradient()
        if name not in NOT_DIFFERENTIATED and name.partition(".")[2] not in ("out", "U", "Q")
    }
    assert listed == set(kernel_fixes.WITHOUT_GRADIENT)


def _gradient_under_dynamo(loss_of):
    """The first layer's weight gradient of ``loss_of(Linear(x))``, eagerly and compiled for XLA."""
    torch.manual_seed(0)
    layer, x = nn.Linear(4, 16), torch.randn(8, 4)
    loss_of(layer(x)).backward()
    want = layer.weight.grad.clone()
    layer.zero_grad()
    layer.to(torch_xla.device())
    step = torch.compile(lambda t: loss_of(layer(t)), backend="openxla")
    step(x.to(torch_xla.device())).backward()
    torch_xla.sync()
    torch._dynamo.reset()
    return layer.weight.grad, want


def _square(h):
    return h[:, :8].T @ h[:, :8] + 4 * torch.eye(8, device=h.device)


OVERRIDDEN = {
    "std": lambda h: h.std(dim=-1).sum(),
    "kl_div": lambda h: nn.functional.kl_div(
        nn.functional.log_softmax(h, -1), torch.full_like(h, 1 / 16), reduction="batchmean"
    ),
    "diag": lambda h: torch.diag(_square(h)).sum(),
    "inverse": lambda h: torch.inverse(_square(h)).sum(),
    "cross": lambda h: torch.cross(h[:, :3], h[:, 3:6], dim=-1).sum(),
    "selu": lambda h: nn.functional.selu(h).sum(),
    "svd": lambda h: torch.svd(h[:, :4])[1].sum(),
    "qr": lambda h: torch.qr(h[:, :4])[1].abs().sum(),  # aten::qr (torch.linalg.qr is another op)
}


def test_torch_xla_still_gives_std_no_gradient_under_dynamo():
    # when a release fixes it, this fails: DecomposeForAutograd can go
    got, _ = _gradient_under_dynamo(OVERRIDDEN["std"])
    assert got is None


@pytest.mark.parametrize("op", sorted(OVERRIDDEN))
def test_under_dynamo_the_ops_torch_xla_overrides_get_eagers_gradient(op):
    undo = [kernel_fixes.DecomposeForAutograd().apply(), kernel_fixes.CorrectEluGradient().apply()]
    try:
        got, want = _gradient_under_dynamo(OVERRIDDEN[op])
    finally:
        for restore in undo:
            restore()
    assert got is not None, f"{op}: no gradient reached the layer before it"
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


ROW = [float(i) for i in range(7)]
DIAGONALS = [[[3.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]], [[5.0, 0.0], [0.0, 4.0]]]
# with_device's corrections whose torch_xla kernel answers a question: (torch_xla's own is right, the one
# in force gives PyTorch's answer, the effect)
STILL_WRONG = {
    "amax": (  # torch_xla 2.9 returns x unreduced for x.amax()
        kernel_fixes.torch_xla_amax_reduces,
        lambda: kernel_fixes.amax_of([[1.0, 3.0], [2.0, 0.0]]) == 3.0,
        "correct_extrema",
    ),
    "empty_dims": (  # x.sum(dim=()): x as it is
        kernel_fixes.torch_xla_reduces_an_empty_dim_list,
        lambda: kernel_fixes.sum_over_no_dims([[1.0, 3.0], [2.0, 0.0]]) == 6.0,
        "correct_empty_dims",
    ),
    "diagonal": (  # torch.diagonal(x) of a 3-D x: the last two dims' diagonal
        kernel_fixes.torch_xla_diagonal_is_right,
        lambda: (
            kernel_fixes.diagonal_of((2, 3, 4)) == torch.diagonal(torch.arange(24.0).view(2, 3, 4)).tolist()
        ),
        "correct_diagonal",
    ),
    "interpolate": (  # 7 pixels by 1.7: floor(i * 7 / 11), not PyTorch's floor(i / 1.7)
        kernel_fixes.torch_xla_interpolates_by_the_scale,
        lambda: (
            kernel_fixes.interpolated(ROW, 1.7) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0, 5.0]
        ),
        "correct_interpolate",
    ),
    "svd": (  # a batch of diagonal matrices: Vh is V with its first two dimensions swapped
        kernel_fixes.torch_xla_batched_svd_is_right,
        lambda: (
            [[[abs(v) for v in row] for row in m] for m in kernel_fixes.svd_vh_of(DIAGONALS)]
            == [[[1.0, 0.0], [0.0, 1.0]]] * 3
        ),
        "correct_batched_svd",
    ),
}


@pytest.mark.parametrize("fix", sorted(STILL_WRONG))
def test_torch_xlas_kernel_is_still_wrong_and_the_corrected_one_lasts_as_long_as_the_session(fix):
    # when a torch_xla upgrade fixes its kernel, this test fails and the correction can go
    torch_xlas_is_right, right_now, effect = STILL_WRONG[fix]
    assert not torch_xlas_is_right()
    setup = xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))
    with pytest.raises(KeyError):
        with xp.session(setup):
            assert right_now()
            raise KeyError("the user's code fails")
    assert not right_now()  # torch_xla's is back
    assert {"effect": effect, "device": "xla"} in [e.describe() for e in setup.effects]


def _same_as_eager(f, x: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """``f`` of ``x`` under a session with with_device: eager's value, shape and gradient."""
    want = x.clone().requires_grad_()
    want_out = f(want)
    want_out.sum().backward()
    with xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))):
        got = x.to(torch_xla.device()).requires_grad_()
        got_out = f(got)
        got_out.sum().backward()
        torch_xla.sync()
        assert got_out.shape == want_out.shape
        np.testing.assert_allclose(
            got_out.detach().cpu().numpy(), want_out.detach().numpy(), rtol=rtol, atol=atol
        )
        np.testing.assert_allclose(got.grad.cpu().numpy(), want.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: x.amax(),
        lambda x: x.amin(),
        lambda x: torch.amax(x, dim=()),
        lambda x: x.abs().amax(dim=(), keepdim=True),
        lambda x: x / x.abs().amax(),  # the fp8 / int8 scale
        lambda x: x.amax(1),
        lambda x: x.amin((0, 2)),
        lambda x: x.amax(-1, keepdim=True),
        lambda x: x.amin((2, 0), keepdim=True),
        lambda x: x[0, 0, 0].amax(),
    ],
    ids=["amax", "amin", "empty_dim", "keepdim_all", "scale", "dim", "dims", "keepdim", "dims_keepdim", "0d"],
)
def test_amax_and_amin_on_the_device_give_eagers_value_shape_and_gradient(reduce):
    torch.manual_seed(0)
    _same_as_eager(reduce, torch.randn(2, 3, 4), rtol=1e-6, atol=1e-7)


EVERY = ()  # an empty dimension list: every dimension, in PyTorch


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: x.sum(dim=EVERY),
        lambda x: x.sum(dim=[], keepdim=True),
        lambda x: x.mean(dim=EVERY, dtype=torch.float64),
        lambda x: x.var(dim=EVERY),
        lambda x: x.std(dim=[], unbiased=False, keepdim=True),
        lambda x: torch.ops.aten.std.dim(x, [], True, False),  # its own XLA kernel
        lambda x: torch.var_mean(x, dim=EVERY)[0] + torch.std_mean(x, dim=EVERY, correction=0)[1],
        lambda x: torch.nanmean(x, dim=EVERY),
        lambda x: torch.linalg.vector_norm(x, dim=EVERY),
        lambda x: x * x.sum(tuple(range(1, x[0, 0].dim()))),  # generic code on a 1-D tensor
        lambda x: (
            x.sum(dim=(0, 2)) + x.mean(1).sum() + x.var(-1, keepdim=True).sum()
        ),  # dims given: as they were
        lambda x: x[0, 0, 0].sum(dim=EVERY),
    ],
    ids=[
        "sum",
        "sum_keepdim",
        "mean_dtype",
        "var",
        "std",
        "std_dim",
        "var_std_mean",
        "nanmean",
        "vector_norm",
        "generic",
        "dims",
        "0d",
    ],
)
def test_reductions_over_an_empty_dim_list_on_the_device_give_eagers_value_shape_and_gradient(reduce):
    torch.manual_seed(0)
    _same_as_eager(reduce, torch.randn(2, 3, 4))


@pytest.mark.parametrize(
    "take",
    [
        lambda x: torch.diagonal(x),
        lambda x: x.diagonal(1),
        lambda x: x.diagonal(-1, -3, -2),
        lambda x: x.view(2, 3, 2, 2).diagonal(0, 0, 1),
        lambda x: torch.diagonal(x, 0, 1, 0) + torch.diagonal(x, 1, 1, 2).sum(),  # other dims: as they were
        lambda x: torch.diagonal_scatter(x, torch.ones(4, 2, device=x.device), 0, 0, 1),
        lambda x: x.clone().diagonal().mul_(3).add_(1),
        lambda x: _written_through(x),
        lambda x: torch.diagonal(x[0]),
    ],
    ids=[
        "default",
        "offset",
        "negative_dims",
        "4d",
        "other_dims",
        "scatter",
        "inplace_view",
        "written_base",
        "2d",
    ],
)
def test_diagonal_over_dims_0_and_1_on_the_device_gives_eagers_value_shape_and_gradient(take):
    torch.manual_seed(0)
    _same_as_eager(take, torch.randn(2, 3, 4))


def _written_through(x: torch.Tensor) -> torch.Tensor:
    """A write through the diagonal view lands in the base tensor."""
    base = x.clone()
    base.diagonal(1).zero_()
    return base


def test_torch_xlas_bilinear_resize_by_size_is_still_wrong_off_the_tpu():
    # BuildResize, torch_xla 2.9's lowering off the TPU: when fixed, this fails and the correction can
    # leave bilinear resizes by size to torch_xla again
    torch.manual_seed(0)
    x = torch.randn(1, 2, 7, 9)
    want = nn.functional.interpolate(x, size=(11, 15), mode="bilinear")
    got = nn.functional.interpolate(x.to(torch_xla.device()), size=(11, 15), mode="bilinear").cpu()
    assert (got - want).abs().max() > 1.0


RESIZES = [  # (input H x W, scale_factor or size, mode, align_corners)
    ((7, 9), 0.6, "nearest", None),
    ((7, 9), 1.7, "nearest", None),
    ((7, 9), (1.1, 1.7), "nearest", None),  # the same height: pixel for pixel, whatever the scale
    ((5, 5), (1.7, 2.05), "nearest", None),  # twice the width: by halves
    ((7, 9), 2.0, "nearest", None),  # a whole scale: torch_xla's own
    ((7, 9), 0.6, "bilinear", False),
    ((16, 10), 3.3, "bilinear", False),
    ((7, 9), (1.5, 0.7), "bilinear", False),
    ((7, 9), 1.7, "bilinear", True),  # align_corners: the scale is ignored, the sizes are not
    ((2, 2), 4.0, "bilinear", False),
    ((7, 9), (11, 15), "bilinear", False),  # by size: wrong off the TPU
    ((7, 9), (21, 3), "bilinear", True),
    ((7, 9), (11, 15), "nearest", None),
]


@pytest.mark.parametrize(
    ("size", "by", "mode", "corners"), RESIZES, ids=[str(i) for i in range(len(RESIZES))]
)
def test_interpolate_on_the_device_gives_eagers_pixels_and_gradient(size, by, mode, corners):
    torch.manual_seed(0)
    kwargs = {} if corners is None else {"align_corners": corners}
    kwargs.update(size=by) if isinstance(by, tuple) and isinstance(by[0], int) else kwargs.update(
        scale_factor=by
    )
    weights = torch.randn(nn.functional.interpolate(torch.zeros(1, 1, *size), **kwargs, mode=mode).shape[2:])
    _same_as_eager(
        lambda x: nn.functional.interpolate(x, mode=mode, **kwargs) * weights.to(x.device),
        torch.randn(2, 3, *size),
        atol=1e-5,  # two weighted sums, one per dimension, where PyTorch's CPU kernel rounds once
    )


def _rebuilt(factors) -> torch.Tensor:
    """U diag(S) Vh, which does not depend on the signs the two libraries choose."""
    u, s, vh = factors
    return (u * s.unsqueeze(-2)) @ vh


SVDS = {
    "linalg": lambda a: _rebuilt(torch.linalg.svd(a, full_matrices=False)),
    "linalg_vh": lambda a: torch.linalg.svd(a, full_matrices=False).Vh.abs(),
    "svd": lambda a: (lambda u, s, v: _rebuilt((u, s, v.mH)))(*torch.svd(a)),
    "svdvals": lambda a: torch.linalg.svdvals(a),
    "matrix_rank": lambda a: torch.linalg.matrix_rank(a).float() + a.sum(),
    "pinv": lambda a: torch.linalg.pinv(a),
    "nuclear_norm": lambda a: torch.norm(a, "nuc", dim=[-2, -1]),
}


@pytest.mark.parametrize("shape", [(3, 4, 2), (2, 3, 3, 3), (1, 2, 5), (5, 5, 5), (4, 3)], ids=str)
@pytest.mark.parametrize("svd", sorted(SVDS))
def test_the_svd_of_a_batch_on_the_device_gives_eagers_value_and_gradient(svd, shape):
    torch.manual_seed(0)
    _same_as_eager(
        SVDS[svd], torch.randn(shape), rtol=1e-3, atol=1e-4
    )  # LAPACK against Jacobi iterations; pinv amplifies


def test_the_svd_of_a_batch_without_its_factors_keeps_eagers_shapes():
    a = torch.randn(3, 4, 2)
    want = [t.shape for t in torch.ops.aten._linalg_svd(a, False, False)]  # what svdvals asks for
    with xp.session(xp.Pipeline(xp.with_device())(xp.TrainingSetup(bn_model()))):
        got = [t.shape for t in torch.ops.aten._linalg_svd(a.to(torch_xla.device()), False, False)]
    assert got == want and want[0] == (0,)  # U and Vh empty, S one row per matrix
