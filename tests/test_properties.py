"""Property tests over permutations and subsets of transforms."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xlapipe as xp
from helpers import tiny_setup

# Every kind of relation is in the pool: wrap_loader_mp needs with_device and comes
# after static_shapes; shard_data needs wrap_loader_mp and excludes wrap_model_mp;
# compile_step excludes shard_data.
POOL = {
    "with_device": [xp.with_device()],
    "with_precision": [xp.with_precision("fp32"), xp.with_precision("bf16"),
                       xp.with_precision("bf16", "downcast"), xp.with_precision("fp16"),
                       xp.with_precision("bf16", "env")],
    "wrap_model_mp": [xp.wrap_model_mp()],
    "wrap_loader_mp": [xp.wrap_loader_mp(), xp.wrap_loader_mp(device_prefetch_size=2)],
    "set_default_tensor_type": [xp.set_default_tensor_type(), xp.set_default_tensor_type(device="xla")],
    "static_shapes": [xp.static_shapes(length=16)],
    "shard_data": [xp.shard_data()],
    "compile_step": [xp.compile_step(), xp.compile_step(optimizer=False)],
    "recompile_guard": [xp.recompile_guard(warmup=2)],
}
# Realising these in this process would turn SPMD on for good (shard_data), pad tuple
# batches (static_shapes refuses them) or compile for minutes (compile_step).
NOT_REALISED = {"shard_data", "static_shapes", "compile_step"}


@st.composite
def lists_of_transforms(draw):
    """Distinct-named transforms in any order, not necessarily valid."""
    names = draw(st.lists(st.sampled_from(sorted(POOL)), unique=True))
    return [draw(st.sampled_from(POOL[n])) for n in names]


def first_broken_relation(transforms):
    """The specification, written out: which relation does this order break?"""
    names = [t.name for t in transforms]
    for i, t in enumerate(transforms):
        before = set(names[:i])
        if t.excludes & set(names):
            return "excludes", t.name
        if not t.needs <= before:
            return "needs", t.name
        if t.after & set(names[i + 1:]):
            return "after", t.name
    return None


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_the_pool_exercises_every_relation():
    transforms = [t for ts in POOL.values() for t in ts]
    assert any(t.needs for t in transforms)
    assert any(t.after for t in transforms)
    assert any(t.excludes for t in transforms)


@SETTINGS
@given(lists_of_transforms())
def test_valid_orders_build_and_invalid_ones_name_the_relation(transforms):
    broken = first_broken_relation(transforms)
    try:
        pipeline = xp.Pipeline(*transforms)
    except xp.OrderError as error:
        assert broken is not None, f"refused a valid order: {error}"
        relation, name = broken
        assert error.relation == relation and name in error.names
        assert all(n in str(error) for n in error.names)
        assert any(word in str(error) for word in ("add ", "move ", "remove "))  # says the fix
    else:
        assert broken is None, f"accepted an order that breaks {broken}"
        assert pipeline.names == tuple(t.name for t in transforms)


def first_broken_prefix(transforms):
    """Applied one at a time, the first transform whose prefix breaks a relation, and which."""
    for k in range(1, len(transforms) + 1):
        broken = first_broken_relation(transforms[:k])
        if broken:
            return broken
    return None


@SETTINGS
@given(lists_of_transforms())
def test_applying_one_at_a_time_fails_exactly_when_the_pipeline_does(transforms):
    broken = first_broken_prefix(transforms)
    assert (broken is None) == (first_broken_relation(transforms) is None)  # the two specs agree
    base = tiny_setup()
    setup = base
    try:
        for t in transforms:
            setup = t(setup)
    except xp.OrderError as error:
        assert broken is not None, f"one at a time refused a valid order: {error}"
        relation, name = broken
        assert error.relation == relation and name in error.names, (error, broken)
    else:
        assert broken is None, f"one at a time accepted an order that breaks {broken}"
        # the same setup as the pipeline's (models and loaders are rebuilt by some transforms)
        assert setup == xp.Pipeline(*transforms)(base).evolve(model=setup.model, loaders=setup.loaders)


@SETTINGS
@given(lists_of_transforms(), st.randoms(use_true_random=False))
def test_result_does_not_depend_on_how_independent_transforms_are_listed(transforms, rnd):
    if first_broken_relation(transforms):
        return
    shuffled = list(transforms)
    rnd.shuffle(shuffled)
    if first_broken_relation(shuffled):
        return
    setup = tiny_setup()
    a, b = xp.Pipeline(*transforms), xp.Pipeline(*shuffled)
    assert a == b and hash(a) == hash(b)
    assert a(setup).summary() == b(setup).summary()


@SETTINGS
@given(lists_of_transforms())
def test_idempotent_and_never_mutates_the_input(transforms):
    if first_broken_relation(transforms):
        return
    setup = tiny_setup()
    fields = {a.name: getattr(setup, a.name) for a in setup.__attrs_attrs__}
    weights = [p.detach().clone() for p in setup.model.parameters()]
    loaders = dict(setup.loaders)
    out = xp.Pipeline(*transforms)(setup)
    for t in transforms:
        assert t(out) is out  # applying again changes nothing
    assert xp.Pipeline(*transforms)(out) is out
    assert {a.name: getattr(setup, a.name) for a in setup.__attrs_attrs__} == fields
    assert dict(setup.loaders) == loaders
    assert all(torch.equal(a, b) for a, b in zip(weights, setup.model.parameters()))


@settings(max_examples=25, deadline=None)
@given(lists_of_transforms())
def test_process_state_is_the_same_before_and_after_a_session(transforms):
    if (first_broken_relation(transforms) or NOT_REALISED & {t.name for t in transforms}
            or any(t.effects and t.name == "with_precision" for t in transforms)):
        return  # the env route needs a fresh process: tested in test_practices
    setup = xp.Pipeline(*transforms)(tiny_setup())
    before = xp.effects.snapshot()
    try:
        with xp.session(setup) as run:
            batch = next(iter(run.loaders["train"]))
            run.step(batch, lambda m, b: torch.nn.functional.cross_entropy(
                m(b[0].to(run.device, next(m.parameters()).dtype)), b[1].to(run.device)))
            raise RuntimeError("user code fails mid-run")
    except RuntimeError as error:
        assert "user code fails" in str(error)
    after = xp.effects.snapshot()
    changed = {k for k in set(before["environ"]) | set(after["environ"])
               if before["environ"].get(k) != after["environ"].get(k)}
    assert not changed, {k: (before["environ"].get(k), after["environ"].get(k)) for k in changed}
    assert after == before
