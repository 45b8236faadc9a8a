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
- :func:`check_listing_is_kept`: a pipeline is equal to another exactly when
  it lists the same transforms in the same order, and its setup records them
  (their hooks, their effects) in that order;
- :func:`check_listing_trains_identically`: a practice trained next to the
  built-ins that act around the update (``accumulate_grad``,
  ``clip_grad_norm``, ``log_every``, ``compile_step`` with either backend),
  listed first and listed last, gives the same weights, the same practice
  state and the same trace of its hook calls;
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

import attrs
import torch
from hypothesis import strategies as st

from xlapipe import effects
from xlapipe.hooks import Hook
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


def check_listing_is_kept(transforms: Sequence[Transform], make_setup: MakeSetup, rnd: random.Random) -> None:
    """Equality is ordered, and the setup keeps the listing: what is listed first acts first."""
    shuffled = list(transforms)
    rnd.shuffle(shuffled)
    if first_broken_relation(transforms) or first_broken_relation(shuffled):
        return
    a, b = Pipeline(*transforms), Pipeline(*shuffled)
    same = [t.name for t in transforms] == [t.name for t in shuffled]
    assert (a == b) == same and (hash(a) == hash(b)) >= same, (a, b)
    setup = a(make_setup())
    assert setup.applied_names == a.names
    assert setup.hooks == tuple(h for t in transforms for h in t.hooks)
    assert setup.effects == tuple(e for t in transforms for e in t.effects)


# -- the listing law: a practice trains the same wherever it is listed ---------------------------

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def companions() -> list[list[Transform]]:
    """The built-in practices a listing law trains next to: everything that acts around the update,
    with each way of compiling the step (none, ``openxla`` with its compiled update, ``torch_xla``)."""
    from xlapipe import transforms as xt

    around = [xt.accumulate_grad(3), xt.clip_grad_norm(0.5), xt.log_every(2, to=_discard)]
    return [
        around,
        [*around, xt.compile_step(backend="openxla", optimizer=True)],
        [*around, xt.compile_step(backend="torch_xla")],
    ]


def _discard(record: dict[str, Any]) -> None:
    """A log sink that keeps nothing."""


def check_listing_trains_identically(
    practice: Transform,
    make_setup: MakeSetup,
    loss_fn: LossFn,
    *,
    epochs: int = 2,
    alongside: Sequence[Sequence[Transform]] | None = None,
    atol: float = 0.0,
) -> None:
    """``practice`` listed first and listed last among each group of ``alongside`` (default:
    :func:`companions`) trains identically: the same weights and practice states (within
    ``atol``; exact by default) and the same trace of its hook calls.

    ``make_setup()`` must give a setup with a ``"train"`` loader whose length is
    not a multiple of 3, so that each epoch ends inside an accumulation window.
    """
    from xlapipe import transforms as xt

    for group in companions() if alongside is None else alongside:
        others = [t for t in group if t.name != practice.name]
        listings = [
            [xt.with_device(), practice, *others],
            [xt.with_device(), *others, practice],
        ]
        valid = [order for order in listings if first_broken_relation(order) is None]
        if len(valid) < 2:
            continue  # the relations allow one listing only: nothing to compare
        (weights_a, states_a, trace_a), (weights_b, states_b, trace_b) = (
            _train_traced(order, practice.name, make_setup, loss_fn, epochs) for order in valid
        )
        names = " -> ".join(t.name for t in valid[0]), " -> ".join(t.name for t in valid[1])
        assert trace_a == trace_b, (
            f"{practice.name} is called differently in {names[0]} and {names[1]}: "
            + _first_diff(trace_a, trace_b)
        )
        _assert_same(weights_a, weights_b, atol, f"the weights after {names[0]} and {names[1]}")
        assert set(states_a) == set(states_b), (sorted(states_a), sorted(states_b))
        for key in states_a:
            _assert_same(states_a[key], states_b[key], atol, f"{key}'s state after {names[0]} and {names[1]}")


def _first_diff(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"call {i}: {x} against {y}"
    return f"{len(a)} calls against {len(b)}"


def _assert_same(a: Any, b: Any, atol: float, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, what
        a, b = a.detach().cpu(), b.detach().cpu()
        same = torch.equal(a, b) if atol == 0 else torch.allclose(a.double(), b.double(), rtol=0, atol=atol)
        assert same, f"{what} differ (max {(a.double() - b.double()).abs().max().item():.3g})"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), what
        for k in a:
            _assert_same(a[k], b[k], atol, f"{what}, {k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, atol, f"{what}, item {i}")
    else:
        assert a == b, f"{what}: {a!r} against {b!r}"


def _train_traced(
    order: list[Transform], name: str, make_setup: MakeSetup, loss_fn: LossFn, epochs: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[tuple]]:
    trace: list[tuple] = []
    traced = [
        attrs.evolve(t, hooks=tuple(_Traced(h, trace) for h in t.hooks)) if t.name == name else t
        for t in order
    ]
    torch.manual_seed(0)
    with session(Pipeline(*traced)(make_setup())) as run:
        for _ in range(epochs):
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
        states = {k: _plain_state(v) for k, v in run.practice_states().items()}
        weights = run.state_dict()
    return weights, states, trace


def _plain_state(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: _plain_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_plain_state(v) for v in state]
    return state


class _Traced(Hook):
    """A hook that records each call of the hook it stands for (the point, the run's counts)."""

    def __init__(self, inner: Hook, trace: list[tuple], run: Any = None) -> None:
        self.inner, self.trace, self.run = inner, trace, run
        self.marks_step = inner.marks_step

    def _note(self, point: str, *detail: Any) -> None:
        counts = (self.run.steps, self.run.updates, self.run.epoch) if self.run is not None else ()
        self.trace.append((point, *detail, *counts))

    def before_placement(self, setup: Any) -> None:
        self._note("before_placement")
        self.inner.before_placement(setup)

    def after_placement(self, model: torch.nn.Module) -> None:
        self._note("after_placement")
        self.inner.after_placement(model)

    def start(self, run: Any) -> Hook:
        self.trace.append(("start",))
        return _Traced(self.inner.start(run), self.trace, run)

    def after_start(self) -> None:
        self._note("after_start")
        self.inner.after_start()

    def before_train(self) -> None:
        self._note("before_train")
        self.inner.before_train()

    def before_step(self, batch: Any) -> Any:
        self._note("before_step")
        return self.inner.before_step(batch)

    def wrap_step(self, step: Any) -> Any:
        self._note("wrap_step")
        return self.inner.wrap_step(step)

    def wrap_forward(self, forward: Any) -> Any:
        self._note("wrap_forward")
        return self.inner.wrap_forward(forward)

    def update_due(self, micro_batches: int) -> bool:
        due = self.inner.update_due(micro_batches)
        self._note("update_due", micro_batches, due)
        return due

    def window_divisor(self, micro_batches: int) -> int:
        divisor = self.inner.window_divisor(micro_batches)
        self._note("window_divisor", micro_batches, divisor)
        return divisor

    def wrap_apply(self, apply: Any) -> Any:
        self._note("wrap_apply")
        return self.inner.wrap_apply(apply)

    def on_gradients(self) -> None:
        self._note("on_gradients")
        self.inner.on_gradients()

    def after_update(self) -> None:
        self._note("after_update")
        self.inner.after_update()

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        self._note("after_step", updated)
        self.inner.after_step(batch, loss, updated)

    def end_epoch(self) -> None:
        self._note("end_epoch")
        self.inner.end_epoch()

    def between_steps(self) -> None:
        self._note("between_steps")
        self.inner.between_steps()

    def outside_step(self) -> Any:
        self._note("outside_step")
        return self.inner.outside_step()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.inner.load_state_dict(state)

    def state_mismatch(self, state: Any) -> str | None:
        return self.inner.state_mismatch(state)

    def before_save(self) -> None:
        self._note("before_save")
        self.inner.before_save()

    def checkpointing(self) -> Any:
        self._note("checkpointing")
        return self.inner.checkpointing()

    def close(self) -> None:
        self._note("close")
        self.inner.close()


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
    """:func:`check_order`, :func:`check_one_at_a_time` and :func:`check_idempotent_and_pure`
    (:func:`check_listing_trains_identically` trains, so it is called on its own)."""
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
