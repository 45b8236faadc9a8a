"""Numerical equivalence: any fp32 subset of the practices trains like eager PyTorch on CPU."""

import itertools

import pytest

import xlapipe as xp
from helpers import eager_losses, tiny_setup, train_losses

FP32 = [
    xp.with_device(),
    xp.with_precision("fp32"),
    xp.wrap_model_mp(),
    xp.wrap_loader_mp(),
    xp.set_default_tensor_type(),
]
SUBSETS = [s for r in range(len(FP32) + 1) for s in itertools.combinations(FP32, r)]


def buildable(subset) -> bool:
    try:
        xp.Pipeline(*subset)
        return True
    except xp.OrderError:
        return False


VALID = [s for s in SUBSETS if buildable(s)]
REFUSED = [s for s in SUBSETS if not buildable(s)]


def ids(subset) -> str:
    return "+".join(t.name for t in subset) or "empty"


def test_every_refused_subset_lacks_with_device():
    # The only relation among the five is "needs with_device"; nothing else is refused.
    assert len(VALID) + len(REFUSED) == 32
    assert all(xp.with_device() not in s and any("with_device" in t.needs for t in s) for s in REFUSED)
    for subset in REFUSED:
        with pytest.raises(xp.OrderError, match="needs with_device before it"):
            xp.Pipeline(*subset)


@pytest.fixture(scope="module")
def reference():
    return {opt: eager_losses(opt, epochs=2) for opt in ("sgd", "adamw")}


@pytest.mark.parametrize("subset", VALID, ids=ids)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fp32_subset_matches_eager_cpu(subset, optimizer, reference):
    got = train_losses(xp.Pipeline(*subset)(tiny_setup(optimizer)), epochs=2)
    want = reference[optimizer]
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-5 * abs(w), (got, want)


BF16 = [
    (xp.with_device(), xp.with_precision("bf16")),
    (
        xp.with_device(),
        xp.with_precision("bf16"),
        xp.wrap_model_mp(),
        xp.wrap_loader_mp(),
        xp.set_default_tensor_type(),
    ),
    (xp.with_device(), xp.with_precision("bf16", mode="downcast")),
    (xp.with_precision("bf16"),),
]


@pytest.mark.parametrize("subset", BF16, ids=ids)
def test_bf16_subset_is_within_bf16_tolerance(subset, reference):
    setup = xp.Pipeline(*subset)(tiny_setup("sgd"))
    if setup.precision.mode == "downcast":
        from helpers import loss_fn

        with xp.session(setup) as run:
            got = [
                float(run.step(b, lambda m, b: loss_fn(m, (b[0].bfloat16(), b[1]))))
                for _ in range(2)
                for b in run.loaders["train"]
            ]
    else:
        got = train_losses(setup, epochs=2)
    want = reference["sgd"]
    assert got != want
    for g, w in zip(got, want):
        assert abs(g - w) <= 3e-2 * abs(w), (got, want)
