"""The transform value: a named, parameterised, pure function over a setup."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
from attrs import field, frozen
from attrs.validators import instance_of, is_callable

if TYPE_CHECKING:  # torch-free at import: a process that only plans pipelines never loads torch
    from xlapipe.effects import Effect
    from xlapipe.hooks import Hook
    from xlapipe.training_setup import TrainingSetup

Params = tuple[tuple[str, Any], ...]
PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v, where) for v in value)
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return value  # kept as is; describe() says how to make it plain ("module:function")
    raise TypeError(
        f"{where} must be plain data (str, int, float, bool, None or tuples of them, or a "
        f"function) so the transform can be described and rebuilt; got {type(value).__name__}"
    )


def _params(value: Mapping[str, Any] | Params) -> Params:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), _plain(v, f"parameter {k!r}")) for k, v in items))


def _names(value: Any) -> frozenset[str]:
    return frozenset([value] if isinstance(value, str) else value)


def _reasons(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    pairs = [tuple(p) for p in items]
    if not all(len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str) and p[1] for p in pairs):
        raise TypeError(f"reasons maps transform names to non-empty explanations (str: str), got {value!r}")
    return tuple(sorted(pairs))


def _effects(items: Iterable[Effect]) -> tuple[Effect, ...]:
    return tuple(items)


def _hooks(items: Iterable[Hook]) -> tuple[Hook, ...]:
    return tuple(items)


def _check_hooks(_: object, __: object, value: tuple[object, ...]) -> None:
    if not value:
        return
    from xlapipe.hooks import Hook

    for hook in value:
        if not isinstance(hook, Hook):
            raise TypeError(f"hooks are xlapipe.hooks.Hook values, got {type(hook).__name__}")


def _check_effects(_: object, __: object, value: tuple[object, ...]) -> None:
    for effect in value:
        if not (
            callable(getattr(effect, "apply", None))
            and callable(getattr(effect, "describe", None))
            and isinstance(getattr(effect, "before_runtime", None), bool)
        ):
            raise TypeError(
                "effects are xlapipe.effects.Effect values (apply(), describe() and a before_runtime "
                f"flag), e.g. EnvVar(name, value); got {type(effect).__name__}"
            )


def check_flag(owner: str, name: str, value: Any) -> None:
    """Refuse a parameter ``name`` of ``owner`` that is not True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


def unchanged(setup: TrainingSetup, **_: Any) -> TrainingSetup:
    """The ``fn`` of a transform that only records effects."""
    return setup


def practice(
    name: str,
    spec: Any,
    fn: Callable[..., TrainingSetup] = unchanged,
    *,
    needs: Iterable[str] | str = (),
    after: Iterable[str] | str = (),
    excludes: Iterable[str] | str = (),
    reasons: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    effects: Iterable[Effect] = (),
    hooks: Iterable[Hook] | None = None,
) -> Transform:
    """The transform ``name`` of a practice whose parameters are the attrs value ``spec``.

    One vocabulary per practice: ``spec``'s fields are the parameters (checked
    by their validators when it is built), the transform's ``params`` and
    description, and ``fn``'s keywords; when ``spec`` is a :class:`Hook`, it is
    the practice's hook (unless ``hooks`` says otherwise).
    """
    if not attrs.has(type(spec)):
        raise TypeError(
            f"{name}: spec must be an attrs value holding the parameters, got {type(spec).__name__}"
        )
    params = {a.name: getattr(spec, a.name) for a in attrs.fields(type(spec)) if a.init}
    if hooks is None:
        from xlapipe.hooks import Hook

        hooks = (spec,) if isinstance(spec, Hook) else ()
    return Transform(
        name,
        fn,
        params,
        needs=needs,
        after=after,
        excludes=excludes,
        effects=effects,
        hooks=hooks,
        reasons=reasons,
    )


class OrderError(ValueError):
    """A pipeline (or a setup's history) breaks a declared relation."""

    def __init__(self, relation: str, names: tuple[str, ...], message: str):
        super().__init__(message)
        self.relation = relation
        self.names = names


@frozen(repr=False)
class Transform:
    """``fn(setup, **params)`` under a name, with relations to other transforms.

    - ``needs``: transforms that must be present and come earlier;
    - ``after``: transforms that, when present, must come earlier;
    - ``excludes``: transforms that cannot be in the same pipeline; ``reasons``
      maps an excluded name to why, and the fix (the error says it).

    ``effects`` are process-wide changes and ``hooks`` the parts it plays in a
    session and its steps (:mod:`xlapipe.hooks`); both are recorded on the
    setup and performed by :func:`xlapipe.session`. Transforms are equal when
    their names, parameters and relations are (what they do follows from those).
    """

    name: str = field(validator=instance_of(str))
    fn: Callable[..., TrainingSetup] = field(default=unchanged, validator=is_callable(), eq=False)
    params: Params = field(default=(), converter=_params)
    needs: frozenset[str] = field(default=frozenset(), converter=_names)
    after: frozenset[str] = field(default=frozenset(), converter=_names)
    excludes: frozenset[str] = field(default=frozenset(), converter=_names)
    effects: tuple[Effect, ...] = field(default=(), converter=_effects, validator=_check_effects, eq=False)
    hooks: tuple[Hook, ...] = field(default=(), converter=_hooks, validator=_check_hooks, eq=False)
    reasons: tuple[tuple[str, str], ...] = field(default=(), converter=_reasons)

    def __attrs_post_init__(self) -> None:
        unknown = sorted({k for k, _ in self.reasons} - self.excludes)
        if unknown:
            raise ValueError(
                f"{self.name}: reasons are for excluded transforms; {', '.join(unknown)} "
                f"{'is' if len(unknown) == 1 else 'are'} not in excludes"
            )
        try:
            inspect.signature(self.fn).bind(None, **dict(self.params))
        except TypeError as error:
            raise TypeError(
                f"{self.name}: fn must take the setup and the parameters as keywords, "
                f"fn(setup, {', '.join(k + '=...' for k, _ in self.params)}) ({error}); a transform that "
                "only records effects or hooks can leave fn out"
            ) from None
        except ValueError:  # no signature to check (some builtins)
            pass

    def __call__(self, setup: TrainingSetup) -> TrainingSetup:
        """Apply once: a second application with equal parameters changes nothing."""
        from xlapipe.training_setup import TrainingSetup

        if not isinstance(setup, TrainingSetup):
            raise TypeError(f"{self.name} applies to a TrainingSetup, got {type(setup).__name__}")
        prior = setup.record(self.name)
        if prior is not None:
            if prior == self.params:
                return setup
            raise ValueError(
                f"{self.name} was already applied to this setup with "
                f"{_format(prior)}; apply {self!r} to the setup from before it instead"
            )
        if self.fn is _outlined:  # an outline: the practice itself, from the registry, does the work
            return rebuild(self.name, self.params)(setup)
        check_order([*cast("tuple[Transform, ...]", setup.applied), self])
        new = self.fn(setup, **dict(self.params))
        return new.evolve(origin=setup.base, applied=new.applied + (self,))

    def describe(self) -> dict:
        """Plain data that :func:`rebuild` turns back into an equal transform."""
        return {
            "name": self.name,
            "params": {k: _jsonable(v, f"{self.name}'s parameter {k!r}") for k, v in self.params},
        }

    def outline(self) -> dict:
        """:meth:`describe` plus :meth:`relations`: what planning needs, read back by :func:`outlined`."""
        return {**self.describe(), **self.relations()}

    def relations(self) -> dict:
        """The relations as plain data."""
        return {
            "needs": sorted(self.needs),
            "after": sorted(self.after),
            "excludes": sorted(self.excludes),
            "reasons": dict(self.reasons),
        }

    def __repr__(self) -> str:
        return f"{self.name}({_format(self.params)})"


def _format(params: Params) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params)


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v, where) for v in value]
    if callable(value):
        raise TypeError(
            f"{where} is the function {getattr(value, '__qualname__', value)!r}, which a "
            "description (plain data, for rebuilding in another process) cannot hold: define it "
            "at the top level of an importable module and pass it as 'module:function'"
        )
    return value


def _outlined(setup: TrainingSetup, **_: Any) -> TrainingSetup:
    """The ``fn`` of an outline, never called: :meth:`Transform.__call__` rebuilds the practice."""
    raise AssertionError("an outlined transform is applied through the registry")


def outlined(item: Mapping[str, Any]) -> Transform:
    """The transform an outline (or a description) names, with its relations, built without torch.

    Built without the practice's factory: the ablation's driver plans and
    reports with outlines. Applied to a setup, it rebuilds the practice from
    the registry (:func:`rebuild`) and applies that. A description has no
    relations; its outline checks no order.
    """
    keys = {"name", "params", "needs", "after", "excludes", "reasons"}
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or set(item) - keys:
        raise ValueError(
            f'an outline is an object with "name" and optional {sorted(keys - {"name"})}, got {item!r}'
        )
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in item.get("params", {}).items()}
    return Transform(
        item["name"],
        _outlined,
        params=params,
        needs=item.get("needs", ()),
        after=item.get("after", ()),
        excludes=item.get("excludes", ()),
        reasons=item.get("reasons", {}),
    )


# The built-in practices, by name: each module of xlapipe.transforms registers one (a test
# checks the list), so a torch-free process can tell them from a user's own.
PRACTICES = frozenset(
    {
        "accumulate_grad",
        "checkpoint_on_preemption",
        "clip_grad_norm",
        "compile_step",
        "ema",
        "hf_traced_masks",
        "log_every",
        "no_host_reads",
        "profile",
        "recompile_guard",
        "scan_layers",
        "set_default_tensor_type",
        "shard_data",
        "static_shapes",
        "with_compile_cache",
        "with_device",
        "with_matmul_precision",
        "with_precision",
        "wrap_loader_mp",
        "wrap_model_mp",
    }
)

# -- the registry: transforms rebuilt from plain data ------------------------------

FACTORIES: dict[str, Callable[..., Transform]] = {}


def register(factory: Callable[..., Transform]) -> Callable[..., Transform]:
    """Make ``factory`` rebuildable by its name, which must be the name of what it builds.

    The factory is checked at once when it can be called without arguments, and
    every transform it builds is checked as it is built.
    """
    builtins()  # first: a factory of the user's own of the same name replaces the built-in, as it did
    name = getattr(factory, "__name__", None)
    if not callable(factory) or not isinstance(name, str) or name == "<lambda>":
        raise TypeError(
            f"register takes a named factory function (def {name or 'f'}() -> Transform), got {factory!r}"
        )

    def check(transform: Any) -> Transform:
        if not isinstance(transform, Transform):
            raise TypeError(f"the factory {name} returned a {type(transform).__name__}, not a Transform")
        if transform.name != name:
            raise ValueError(
                f"the factory {name} builds a transform named {transform.name!r}: a factory and its "
                f"transforms share one name, so that a description rebuilds what it describes. Rename "
                f"the factory or the transform."
            )
        return transform

    @functools.wraps(factory)
    def checked(*args: Any, **kwargs: Any) -> Transform:
        return check(factory(*args, **kwargs))

    if all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(factory).parameters.values()
    ):
        try:
            probe = factory()
        except Exception:  # noqa: BLE001 - its defaults are refused: checked when it is called
            probe = None
        if probe is not None:
            check(probe)
    FACTORIES[name] = checked
    return checked


def builtins() -> None:
    """Register the built-in practices (and their claims): importing ``xlapipe`` leaves them out."""
    import xlapipe.transforms  # noqa: F401 - each of its modules registers one


def rebuild(name: str, params: Mapping[str, Any] | Params = ()) -> Transform:
    """The transform ``name`` with ``params``, from the registry (the built-in practices register first)."""
    if isinstance(name, str) and name not in FACTORIES:
        builtins()
    if not isinstance(name, str) or name not in FACTORIES:
        raise ValueError(
            f"unknown transform {name!r}; known: {', '.join(sorted(FACTORIES))} (a transform "
            "of your own is known once the module that registers it is imported)"
        )
    items: Iterable[tuple[str, Any]]
    if isinstance(params, Mapping):
        items = params.items()
    elif isinstance(params, (tuple, list)) and all(
        isinstance(p, (tuple, list)) and len(p) == 2 for p in params
    ):
        items = params
    else:
        raise ValueError(f"the parameters of {name} must be an object of name: value pairs, got {params!r}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in items}
    try:
        return FACTORIES[name](**kwargs)
    except TypeError as error:
        if "argument" not in str(error):
            raise
        raise ValueError(f"cannot rebuild {name} with parameters {kwargs}: {error}") from None


# -- relations -----------------------------------------------------------------------


def check_order(transforms: Sequence[Transform]) -> None:
    """Raise :class:`OrderError` for the first relation ``transforms`` breaks."""
    position: dict[str, int] = {}
    for i, t in enumerate(transforms):
        if not isinstance(t, Transform):
            raise TypeError(
                f"a pipeline holds Transform values; item {i} is {type(t).__name__} "
                "(did you pass the factory, e.g. with_device instead of with_device()?)"
            )
        if t.name in position:
            raise OrderError(
                "duplicate",
                (t.name,),
                f"{t.name} appears twice (items {position[t.name]} and {i}); a pipeline "
                f"holds each transform once: keep one, or use pipeline.replace({t!r})",
            )
        position[t.name] = i
    for i, t in enumerate(transforms):
        for other in sorted(t.excludes):
            if other in position:
                why = (  # either side of an exclusion may say why
                    dict(t.reasons).get(other)
                    or dict(transforms[position[other]].reasons).get(t.name)
                    or "they cannot be combined; remove one of them"
                )
                raise OrderError("excludes", (t.name, other), f"{t.name} excludes {other}: {why}")
        for other in sorted(t.needs):
            if other not in position:
                raise OrderError(
                    "needs",
                    (t.name, other),
                    f"{t.name} needs {other} before it, and there is no {other}: "
                    f"add {other}() before {t.name}",
                )
            if position[other] > i:
                raise OrderError(
                    "needs",
                    (t.name, other),
                    f"{t.name} needs {other} before it, but {other} comes after it: "
                    f"move {other} before {t.name}",
                )
        for other in sorted(t.after):
            if other in position and position[other] > i:
                raise OrderError(
                    "after",
                    (t.name, other),
                    f"{t.name} must come after {other}: move {other} before {t.name}",
                )
