"""Which pipelines an ablation runs: pure functions from a full pipeline to variants.

Every mode returns a :class:`Plan`: the variants in the order they run, the
name of the baseline variant the table compares against, and the subsets the
relations refused (factorial mode), so nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attrs import evolve, field, frozen

from xlapipe._convert import strs
from xlapipe.ablation import design as designs
from xlapipe.pipeline import Pipeline
from xlapipe.transform import OrderError

MODES = ("leave-one-out", "add-one", "factorial", "explicit")
DESIGNS = ("auto", "full", "fractional")
EAGER = "eager"
AA_NOTE = "A/A pair of "  # the note of a row that repeats another: "A/A pair of NAME: ..."


@frozen
class Variant:
    """One pipeline to measure, under a name that says how it differs."""

    name: str
    pipeline: Pipeline
    note: str = ""

    @property
    def description(self) -> list[dict[str, Any]]:
        return self.pipeline.describe()

    @property
    def key(self) -> str:
        """The variant's identity in a results file: its name and its pipeline."""
        return json.dumps([self.name, self.description], sort_keys=True)


@frozen
class Refused:
    """A combination the relations do not allow, with the reason."""

    names: tuple[str, ...]
    reason: str


def variant_tuple(items: Iterable[Variant]) -> tuple[Variant, ...]:
    return tuple(items)


def _refused_tuple(items: Iterable[Refused]) -> tuple[Refused, ...]:
    return tuple(items)


@frozen
class Plan:
    """The variants of one ablation, which one is the baseline, what was refused."""

    mode: str
    variants: tuple[Variant, ...] = field(converter=variant_tuple)
    baseline: str
    refused: tuple[Refused, ...] = field(default=(), converter=_refused_tuple)
    factors: tuple[str, ...] = field(default=(), converter=strs)  # factorial: the factors switched
    design: str = ""  # factorial: the design and what it confounds

    def __attrs_post_init__(self) -> None:
        names = [v.name for v in self.variants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(duplicates)}")
        if self.baseline not in names:
            raise ValueError(
                f"the baseline {self.baseline!r} is not one of the variants ({', '.join(names)}); "
                "name one of them"
            )

    def __getitem__(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r}; variants: {', '.join(v.name for v in self.variants)}")

    def with_baseline(self, name: str | None) -> Plan:
        """The same plan compared against variant ``name`` (None keeps the current one)."""
        if name is None:
            return self
        if name not in [v.name for v in self.variants]:
            raise ValueError(
                f"no variant {name!r} to compare against; variants: {', '.join(v.name for v in self.variants)}"
            )
        return evolve(self, baseline=name)

    def with_twin(self, name: str | None = None) -> Plan:
        """The same plan with an A/A row: variant ``name`` (default: the last) a second time.

        The two rows are the same pipeline, so their comparison shows the
        noise floor of the runs: it must come out "no detectable difference".
        """
        if not self.variants:
            return self
        original = self[name] if name is not None else self.variants[-1]
        twin = Variant(
            f"{original.name} (again)",
            original.pipeline,
            f"{AA_NOTE}{original.name}: the same pipeline run twice, the noise floor",
        )
        if twin.name in [v.name for v in self.variants]:
            return self
        return evolve(self, variants=(*self.variants, twin))

    def with_eager(self) -> Plan:
        """The same plan with eager PyTorch on the CPU (the empty pipeline) as an extra first row.

        Nothing is added when a variant already has the empty pipeline.
        """
        if any(not len(v.pipeline) for v in self.variants):
            return self
        eager = Variant(EAGER, Pipeline(), "extra reference row: eager PyTorch on the CPU, no XLA")
        return evolve(self, variants=(eager, *self.variants))


def check_description(value: Any, what: str = "a pipeline description") -> list[dict[str, Any]]:
    """``value`` if it is a pipeline description (a list of {"name": str, "params": {...}}), else ValueError."""
    shape = 'a JSON list of {"name": ..., "params": {...}} objects'
    if not isinstance(value, list):
        raise ValueError(f"{what} must be {shape}, got {type(value).__name__} {_short(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ValueError(
                f'{what}: item {i} must be an object like {{"name": "with_device"}}, got {_short(item)}'
            )
        if not isinstance(item.get("name"), str):
            raise ValueError(f'{what}: item {i} needs a "name" (a transform\'s name), got {_short(item)}')
        if not isinstance(item.get("params", {}), Mapping):
            raise ValueError(
                f'{what}: item {i} ({item["name"]}): "params" must be an object, got '
                f"{_short(item.get('params'))}"
            )
        unknown = sorted(set(item) - {"name", "params"})
        if unknown:
            raise ValueError(
                f'{what}: item {i} ({item["name"]}) has unknown keys {unknown}; only "name" and "params"'
            )
    return value


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, str, int, float, type(None))) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_names(full: Pipeline, names: Iterable[str]) -> None:
    unknown = sorted(set(names) - set(full.names))
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not in the pipeline "
            f"{full!r}; choose among {', '.join(full.names) or '(none)'}"
        )


def _subset(full: Pipeline, names: Iterable[str]) -> Pipeline:
    """The transforms of ``full`` named in ``names``, in ``full``'s order."""
    keep = set(names)
    _check_names(full, keep)
    return Pipeline(*(t for t in full if t.name in keep))


def _baseline(full: Pipeline, baseline: Sequence[str] | None) -> Variant:
    if not baseline:
        return Variant("baseline", Pipeline(), "empty pipeline")
    try:
        pipeline = _subset(full, baseline)
    except OrderError as error:
        raise ValueError(f"the baseline {list(baseline)} is not a valid pipeline: {error}") from None
    return Variant("baseline", pipeline, "only " + ", ".join(pipeline.names))


def _add(variants: list[Variant], variant: Variant) -> None:
    """Append ``variant`` unless an equal pipeline is already planned (then note it there)."""
    for i, v in enumerate(variants):
        if v.pipeline == variant.pipeline:
            also = f"same pipeline as {variant.name}"
            variants[i] = Variant(v.name, v.pipeline, f"{v.note}; {also}" if v.note else also)
            return
    variants.append(variant)


def leave_one_out(full: Pipeline, baseline: Sequence[str] | None = None) -> Plan:
    """The baseline, the full pipeline, then the full pipeline less each transform.

    A transform others need cannot go alone: its dependents go too, and the
    variant's name says so, e.g. ``-with_device (and wrap_loader_mp, wrap_model_mp)``.
    """
    base = _baseline(full, baseline)
    variants = [base]
    _add(variants, Variant("full", full, "every transform"))
    for name in full.names:
        smaller = full.without(name, dependents=True)
        also = sorted(set(full.names) - set(smaller.names) - {name})
        label = f"-{name}" + (f" (and {', '.join(also)})" if also else "")
        _add(variants, Variant(label, smaller, f"{name} is needed by {', '.join(also)}" if also else ""))
    return Plan("leave-one-out", variants, base.name)


def _with_needs(current: Pipeline, full: Pipeline, name: str) -> tuple[Pipeline, list[str]]:
    """``current`` plus ``name``, adding first (from ``full``) whatever it needs and lacks."""
    added: list[str] = []

    def visit(n: str) -> None:
        if n in current.names or n in added:
            return
        for need in sorted(full[n].needs):
            if need not in full.names:
                raise ValueError(f"{n} needs {need}, which is not in the pipeline {full!r}")
            visit(need)
        added.append(n)

    visit(name)
    # In the full pipeline's order: a listing is part of what a pipeline is (order can matter).
    return _subset(full, [*current.names, *added]), [n for n in added if n != name]


def add_one(
    full: Pipeline,
    baseline: Sequence[str] | None = None,
    order: Sequence[str] | None = None,
    cumulative: bool = True,
) -> Plan:
    """The baseline, then one transform added per step.

    ``cumulative`` (the default) keeps what earlier steps added, like the
    original report (baseline, + wrappers, + default tensor type); otherwise
    each step is the baseline plus one transform. Transforms are added in
    ``order`` (default: the full pipeline's). A transform whose needs are not
    yet met gets them added first, in the same step, and the name says so:
    ``+wrap_loader_mp (with with_device)``.
    """
    base = _baseline(full, baseline)
    todo = [n for n in (order or full.names) if n not in base.pipeline.names]
    _check_names(full, todo)
    variants = [base]
    current = base.pipeline
    for name in todo:
        if name in current.names:  # added earlier as something else's need
            continue
        start = current if cumulative else base.pipeline
        pipeline, needs = _with_needs(start, full, name)
        label = f"+{name}" + (f" (with {', '.join(needs)})" if needs else "")
        _add(variants, Variant(label, pipeline, "adds " + ", ".join([*needs, name])))
        if cumulative:
            current = pipeline
    return Plan("add-one", variants, base.name)


def factorial(
    full: Pipeline,
    factors: Sequence[str] | None = None,
    baseline: Sequence[str] | None = None,
    design: str = "full",
) -> Plan:
    """The subsets of ``factors`` (default: all transforms) the relations allow.

    Transforms of ``full`` that are not factors stay in every variant. A
    subset that breaks a relation (e.g. ``wrap_loader_mp`` without
    ``with_device``) is listed in ``Plan.refused`` with the reason. The
    baseline is the subset named by ``baseline`` (default: no factor).
    ``design`` is ``"full"`` (every subset), ``"fractional"`` (a resolution V
    fraction: main effects and pairs stay estimable, see
    :mod:`xlapipe.ablation.design`) or ``"auto"`` (fractional above
    five factors). The baseline subset is always run, in the fraction or not.
    """
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    factors = list(factors or full.names)
    _check_names(full, factors)
    if len(set(factors)) != len(factors):
        raise ValueError(f"factors are listed twice: {factors}")
    wanted = set(baseline or ())
    if not wanted <= set(factors):
        raise ValueError(f"the baseline {sorted(wanted)} must be a subset of the factors {factors}")
    fraction = design == "fractional" or (design == "auto" and len(factors) > designs.FULL_UP_TO)
    chosen_design = designs.fractional(factors) if fraction else designs.full(factors)
    runs = list(chosen_design.runs)
    if frozenset(wanted) not in runs:
        runs.insert(0, frozenset(wanted))
    fixed = [n for n in full.names if n not in factors]
    variants: list[Variant] = []
    refused: list[Refused] = []
    for on in runs:
        chosen = tuple(f for f in factors if f in on)
        try:
            pipeline = _subset(full, [*fixed, *chosen])
        except OrderError as error:
            refused.append(Refused(chosen, str(error)))
            continue
        name = " + ".join(chosen) if chosen else "none"
        variants.append(Variant(name, pipeline, "fixed: " + ", ".join(fixed) if fixed else ""))
    if not variants:
        raise ValueError(f"no subset of {factors} makes a valid pipeline: {refused[0].reason}")
    base = next((v for v in variants if set(v.pipeline.names) - set(fixed) == wanted), None)
    if base is None:
        reason = next(r.reason for r in refused if set(r.names) == wanted)
        raise ValueError(f"the baseline subset {sorted(wanted) or '(none)'} is refused: {reason}")
    return Plan("factorial", variants, base.name, refused, factors, chosen_design.confounding())


def explicit(pipelines: Sequence[Any], baseline: str | None = None) -> Plan:
    """Variants listed by hand: pipelines, descriptions, or ``{"name": ..., "pipeline": [...]}``.

    The baseline is the first one unless ``baseline`` names another.
    """
    if isinstance(pipelines, (str, bytes, Mapping)) or not isinstance(pipelines, Sequence):
        raise ValueError(
            "explicit variants are a list whose items are pipeline descriptions or "
            f'{{"name": ..., "pipeline": [...]}}; got {type(pipelines).__name__} {_short(pipelines)}'
        )
    if not pipelines:
        raise ValueError("an explicit ablation needs at least one pipeline")
    variants: list[Variant] = []
    for i, item in enumerate(pipelines):
        name, value = f"v{i}", item
        if isinstance(item, Variant):
            variants.append(item)
            continue
        if isinstance(item, Mapping):
            if "pipeline" not in item:
                raise ValueError(
                    f"explicit variant {i} must be a pipeline description (a list) or "
                    f'{{"name": ..., "pipeline": [...]}}; got keys {sorted(item)}'
                )
            name, value = str(item.get("name", name)), item["pipeline"]
        elif not isinstance(item, (list, Pipeline)):
            raise ValueError(
                f"explicit variant {i} must be a pipeline description (a list) or "
                f'{{"name": ..., "pipeline": [...]}}; got {_short(item)}'
            )
        pipeline = (
            value
            if isinstance(value, Pipeline)
            else Pipeline.from_description(check_description(value, f"explicit variant {i}"))
        )
        if not isinstance(item, Mapping) or "name" not in item:
            name = "empty" if not len(pipeline) else " + ".join(pipeline.names)
        variants.append(Variant(name, pipeline))
    return Plan("explicit", variants, baseline or variants[0].name)


def plan(
    mode: str,
    full: Pipeline | None = None,
    *,
    baseline: Sequence[str] | None = None,
    factors: Sequence[str] | None = None,
    order: Sequence[str] | None = None,
    cumulative: bool = True,
    variants: Sequence[Any] | None = None,
    design: str | None = None,
) -> Plan:
    """The plan for ``mode`` (one of :data:`MODES`); ``design`` (factorial only) defaults to "auto"."""
    if mode not in MODES:
        raise ValueError(f"unknown ablation mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "explicit":
        if variants is None:
            raise ValueError("mode 'explicit' needs variants=[...] (CLI: --variants JSON)")
        return explicit(variants)
    if variants is not None:
        raise ValueError(f"variants=... is only for mode 'explicit', not {mode!r}")
    if design is not None and mode != "factorial":
        raise ValueError(f"design={design!r} is only for mode 'factorial', not {mode!r}")
    if full is None:
        raise ValueError(f"mode {mode!r} needs the full pipeline")
    if mode == "leave-one-out":
        return leave_one_out(full, baseline)
    if mode == "add-one":
        return add_one(full, baseline, order, cumulative)
    return factorial(full, factors, baseline, design or "auto")
