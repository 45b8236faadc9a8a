"""Property tests over permutations and subsets of the built-in transforms, with xlapipe.testing."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xlapipe as xp
from helpers import tiny_setup
from xlapipe import testing

# Every kind of relation is in the pool: wrap_loader_mp needs with_device and comes
# after static_shapes; shard_data needs wrap_loader_mp and excludes wrap_model_mp;
# compile_step excludes shard_data.
POOL = testing.pool(
    xp.with_device(),
    xp.with_precision("fp32"),
    xp.with_precision("bf16"),
    xp.with_precision("bf16", "downcast"),
    xp.with_precision("fp16"),
    xp.with_precision("bf16", "env"),
    xp.wrap_model_mp(),
    xp.wrap_loader_mp(),
    xp.wrap_loader_mp(device_prefetch_size=2),
    xp.set_default_tensor_type(),
    xp.set_default_tensor_type(device="xla"),
    xp.static_shapes(length=16),
    xp.shard_data(),
    xp.compile_step(),
    xp.compile_step(optimizer=False),
    xp.recompile_guard(warmup=2),
    xp.accumulate_grad(2),
    xp.clip_grad_norm(1.0),
    xp.log_every(5),
)
# Realising these in this process would turn SPMD on for good (shard_data), pad tuple
# batches (static_shapes refuses them) or compile for minutes (compile_step).
NOT_REALISED = {"shard_data", "static_shapes", "compile_step"}
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_the_pool_exercises_every_relation():
    transforms = [t for ts in POOL.values() for t in ts]
    assert any(t.needs for t in transforms)
    assert any(t.after for t in transforms)
    assert any(t.excludes for t in transforms)


def test_the_prefix_spec_agrees_with_the_whole_list_spec():
    for transforms in (
        [xp.shard_data(), xp.wrap_model_mp()],
        [xp.wrap_loader_mp(), xp.static_shapes(length=8)],
        [xp.with_device(), xp.wrap_loader_mp()],
    ):
        assert (testing.first_broken_prefix(transforms) is None) == (
            testing.first_broken_relation(transforms) is None
        )


@SETTINGS
@given(testing.orderings(POOL))
def test_valid_orders_build_and_invalid_ones_name_the_relation(transforms):
    testing.check_order(transforms)


@SETTINGS
@given(testing.orderings(POOL))
def test_applying_one_at_a_time_fails_exactly_when_the_pipeline_does(transforms):
    testing.check_one_at_a_time(transforms, tiny_setup)


@SETTINGS
@given(testing.orderings(POOL), st.randoms(use_true_random=False))
def test_equality_is_ordered_and_the_setup_keeps_the_listing(transforms, rnd):
    testing.check_listing_is_kept(transforms, tiny_setup, rnd)


@SETTINGS
@given(testing.orderings(POOL))
def test_idempotent_and_never_mutates_the_input(transforms):
    testing.check_idempotent_and_pure(transforms, tiny_setup)


def step_once(run):
    batch = next(iter(run.loaders["train"]))
    run.step(
        batch,
        lambda m, b: torch.nn.functional.cross_entropy(
            m(b[0].to(run.device, next(m.parameters()).dtype)), b[1].to(run.device)
        ),
    )


@settings(max_examples=25, deadline=None)
@given(testing.orderings(POOL))
def test_process_state_is_the_same_before_and_after_a_session(transforms):
    if (
        testing.first_broken_relation(transforms)
        or NOT_REALISED & {t.name for t in transforms}
        or any(t.effects and t.name == "with_precision" for t in transforms)
    ):
        return  # the env route needs a fresh process: tested in test_practices
    testing.check_session_restores_state(xp.Pipeline(*transforms)(tiny_setup()), step_once)
