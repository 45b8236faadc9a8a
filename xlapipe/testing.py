"""Property tests for transforms, yours included: hypothesis strategies and the laws they obey.

>>> from hypothesis import given
>>> from xlapipe import testing
>>> POOL = testing.pool(xp.with_device(), xp.wrap_loader_mp(), my_practice(), my_practice(level=2))
>>> @given(testing.orderings(POOL))
... def test_my_practice_obeys_the_laws(transforms):
...     testing.check_laws(transforms, make_setup)

The laws, each a function that raises ``AssertionError`` naming what broke:

- :func:`check_order`: a list of transforms builds a pipeline exactly when it
  breaks none of their declared relations, and a refusal names the relation,
  both transforms and the fix;
- :func:`check_one_at_a_time`: applying them one by one to a setup fails
  exactly when a prefix breaks a relation, and otherwise gives the pipeline's
  setup;
- :func:`check_independent_of_listing`: two valid listings of the same
  transforms give equal pipelines and the same setup;
- :func:`check_idempotent_and_pure`: applying a transform again changes
  nothing, and the input setup (fields, weights, loaders) is never changed;
- :func:`check_session_restores_state`: after a session that fails mid-run,
  environment variables, default dtype and default device are as before.

Needs ``hypothesis`` (``pip install xlapipe[test]``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from xlapipe import effects
from xlapipe.pipeline import Pipeline
from xlapipe.session import session
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import OrderError, Transform

Pool = dict[str, list[Transform]]
MakeSetup = Callable[[], TrainingSetup]
FIXES = ("add ", "move ", "remove ")


def pool(*transforms: Transform) -> Pool:
    """The transforms grouped by name: an ordering draws at most one of each name."""
    grouped: Pool = {}
    for t in transforms:
        if not isinstance(t, Transform):
            raise TypeError(f"pool takes Transform values, got {type(t).__name__}")
        grouped.setdefault(t.name, []).append(t)
    return grouped


def orderings(transforms: Pool) -> st.SearchStrategy[list[Transform]]:
    """Lists of distinct-named transforms from ``transforms``, in any order, valid or not."""
    names = sorted(transforms)

    @st.composite
    def draw_list(draw: Any) -> list[Transform]:
        chosen = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
        return [draw(st.sampled_from(transforms[n])) for n in chosen]

    return draw_list()


def first_broken_relation(transforms: Sequence[Transform]) -> tuple[str, str] | None:
    """The specification of the relations, written out: (relation, transform) first broken, or None."""
    names = [t.name for t in transforms]
    for i, t in enumerate(transforms):
        if t.excludes & set(names):
            return "excludes", t.name
        if not t.needs <= set(names[:i]):
            return "needs", t.name
        if t.after & set(names[i + 1 :]):
            return "after", t.name
    return None


def first_broken_prefix(transforms: Sequence[Transform]) -> tuple[str, str] | None:
    """Applied one at a time: the relation broken by the first prefix that breaks one."""
    for k in range(1, len(transforms) + 1):
        broken = first_broken_relation(transforms[:k])
        if broken:
            return broken
    return None


def check_order(transforms: Sequence[Transform]) -> Pipeline | None:
    """A pipeline builds exactly when no relation is broken; a refusal says which and how to fix it."""
    broken = first_broken_relation(transforms)
    try:
        pipeline = Pipeline(*transforms)
    except OrderError as error:
        assert broken is not None, f"refused a valid order {list(transforms)}: {error}"
        relation, name = broken
        assert error.relation == relation and name in error.names, (error, broken)
        assert all(n in str(error) for n in error.names), f"the message names both transforms: {error}"
        assert any(fix in str(error) for fix in FIXES), f"the message says the fix: {error}"
        return None
    assert broken is None, f"accepted {list(transforms)}, which breaks {broken}"
    assert pipeline.names == tuple(t.name for t in transforms)
    return pipeline


def check_one_at_a_time(transforms: Sequence[Transform], make_setup: MakeSetup) -> None:
    """Applying transforms one by one fails exactly when a prefix breaks a relation."""
    broken = first_broken_prefix(transforms)
    base = make_setup()
    setup = base
    try:
        for t in transforms:
            setup = t(setup)
    except OrderError as error:
        assert broken is not None, f"one at a time refused a valid order {list(transforms)}: {error}"
        assert error.relation == broken[0] and broken[1] in error.names, (error, broken)
        return
    assert broken is None, f"one at a time accepted {list(transforms)}, which breaks {broken}"
    # The pipeline's setup, up to the objects some transforms build anew (wrapped models, loaders).
    expected = Pipeline(*transforms)(base)
    assert setup == expected.evolve(model=setup.model, loaders=setup.loaders), (setup, expected)


def check_independent_of_listing(
    transforms: Sequence[Transform], make_setup: MakeSetup, rnd: random.Random
) -> None:
    """Two valid listings of the same transforms are one pipeline, with one result."""
    shuffled = list(transforms)
    rnd.shuffle(shuffled)
    if first_broken_relation(transforms) or first_broken_relation(shuffled):
        return
    a, b = Pipeline(*transforms), Pipeline(*shuffled)
    assert a == b and hash(a) == hash(b), (a, b)
    setup = make_setup()
    assert a(setup).summary() == b(setup).summary(), (a, b)


def check_idempotent_and_pure(transforms: Sequence[Transform], make_setup: MakeSetup) -> None:
    """Applying again changes nothing; the setup given is never changed (fields, weights, loaders)."""
    if first_broken_relation(transforms):
        return
    setup = make_setup()
    fields = {a.name: getattr(setup, a.name) for a in setup.__attrs_attrs__}
    weights = [t.detach().clone() for t in setup.module.state_dict().values()]
    loaders = dict(setup.loaders)
    out = Pipeline(*transforms)(setup)
    for t in transforms:
        assert t(out) is out, f"{t!r} applied again changed the setup"
    assert Pipeline(*transforms)(out) is out
    assert {a.name: getattr(setup, a.name) for a in setup.__attrs_attrs__} == fields, (
        "the input setup changed"
    )
    assert dict(setup.loaders) == loaders, "the input setup's loaders changed"
    assert all(torch.equal(a, b) for a, b in zip(weights, setup.module.state_dict().values())), (
        "the input model's weights changed"
    )


def check_laws(transforms: Sequence[Transform], make_setup: MakeSetup) -> None:
    """:func:`check_order`, :func:`check_one_at_a_time` and :func:`check_idempotent_and_pure`."""
    check_order(transforms)
    check_one_at_a_time(transforms, make_setup)
    check_idempotent_and_pure(transforms, make_setup)


class _Planned(RuntimeError):
    """The failure :func:`check_session_restores_state` raises inside the session."""


def check_session_restores_state(
    setup: TrainingSetup,
    body: Callable[[Any], None] | None = None,
    ignore: Sequence[str] = ("PYTEST_CURRENT_TEST",),
) -> None:
    """Run ``body(run)`` in a session, fail inside it, and check process state is as before.

    ``ignore``: environment variables others change meanwhile (pytest's own).
    """

    def state() -> dict:
        snap = effects.snapshot()
        for key in ignore:
            snap["environ"].pop(key, None)
        return snap

    before = state()
    try:
        with session(setup) as run:
            if body is not None:
                body(run)
            raise _Planned("the user's code fails mid-run")
    except _Planned:
        pass
    after = state()
    changed = {
        k: (before["environ"].get(k), after["environ"].get(k))
        for k in set(before["environ"]) | set(after["environ"])
        if before["environ"].get(k) != after["environ"].get(k)
    }
    assert not changed, f"environment variables not restored: {changed}"
    assert after == before, f"process state not restored: {before} -> {after}"
