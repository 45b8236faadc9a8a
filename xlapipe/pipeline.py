"""The pipeline value: an ordered, validated, immutable composition of transforms."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import toolz
from attrs import field, frozen

from xlapipe.transform import OrderError, Transform, check_order, outlined, rebuild

if TYPE_CHECKING:  # torch-free at import, as xlapipe.transform
    from xlapipe.training_setup import TrainingSetup


@frozen(init=False, eq=False, repr=False)
class Pipeline:
    """``Pipeline(t1, t2, ...)``: apply with ``pipeline(setup)``.

    Relations between transforms are checked here, when it is built. Two
    pipelines are equal when they hold the same transforms in the same order
    (what is listed first acts first, and order can matter: two practices that
    both act on the gradients), so equal pipelines train identically.
    """

    transforms: tuple[Transform, ...] = field()

    def __init__(self, *transforms: Transform) -> None:
        check_order(transforms)
        self.__attrs_init__(tuple(transforms))

    def __call__(self, setup: TrainingSetup) -> TrainingSetup:
        """The setup with every transform applied in order; ``setup`` is untouched."""
        from xlapipe.training_setup import TrainingSetup

        if not isinstance(setup, TrainingSetup):
            raise TypeError(f"a pipeline applies to a TrainingSetup, got {type(setup).__name__}")
        result: TrainingSetup = toolz.pipe(setup, *self.transforms)
        return result

    apply = __call__

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.transforms)

    @property
    def effects(self) -> tuple:
        """Every process-wide effect the pipeline's transforms record."""
        return tuple(e for t in self.transforms for e in t.effects)

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __len__(self) -> int:
        return len(self.transforms)

    def __contains__(self, item: object) -> bool:
        return item in self.names if isinstance(item, str) else item in self.transforms

    def __getitem__(self, name: str) -> Transform:
        for t in self.transforms:
            if t.name == name:
                return t
        raise KeyError(f"no {name} in {self!r}")

    def without(self, name: str, dependents: bool = False) -> Pipeline:
        """This pipeline less ``name``; with ``dependents``, less what needs it, directly or not."""
        self[name]
        drop = {name}
        while dependents:
            more = {t.name for t in self.transforms if t.needs & drop} - drop
            if not more:
                break
            drop |= more
        try:
            return Pipeline(*(t for t in self.transforms if t.name not in drop))
        except OrderError as error:
            if error.relation != "needs":
                raise
            needing = sorted(t.name for t in self.transforms if name in t.needs)
            raise OrderError(
                "needs",
                error.names,
                f"{error} (or drop what needs {name} too: pipeline.without({name!r}, dependents=True) "
                f"also removes {', '.join(needing)})",
            ) from None

    def replace(self, transform: Transform) -> Pipeline:
        """This pipeline with the transform of the same name swapped for ``transform``."""
        self[transform.name]
        return Pipeline(*(transform if t.name == transform.name else t for t in self.transforms))

    def add(self, transform: Transform) -> Pipeline:
        """This pipeline plus ``transform``, at the latest position its relations allow."""
        if transform.name in self.names:
            raise OrderError(
                "duplicate",
                (transform.name,),
                f"{transform.name} is already in {self!r}; use pipeline.replace({transform!r})",
            )
        first_error: OrderError | None = None
        for i in range(len(self.transforms), -1, -1):
            candidate = (*self.transforms[:i], transform, *self.transforms[i:])
            try:
                return Pipeline(*candidate)
            except OrderError as error:
                first_error = first_error or error
        assert first_error is not None
        raise first_error

    def __add__(self, other: Transform | Pipeline) -> Pipeline:
        """``pipeline + transform`` is :meth:`add`; ``pipeline + other`` adds other's transforms in turn."""
        if isinstance(other, Transform):
            return self.add(other)
        if isinstance(other, Pipeline):
            out = self
            for t in other.transforms:
                out = out.add(t)
            return out
        return NotImplemented

    def describe(self) -> list[dict[str, Any]]:
        """Plain data (JSON-ready) that :meth:`from_description` rebuilds."""
        return [t.describe() for t in self.transforms]

    @classmethod
    def from_description(cls, description: Iterable[Mapping[str, Any]]) -> Pipeline:
        """Rebuild a pipeline from :meth:`describe`'s output."""
        if isinstance(description, (str, bytes, Mapping)) or not isinstance(description, Iterable):
            raise ValueError(
                'a pipeline description is a list of {"name": ..., "params": {...}} objects, '
                f"got {type(description).__name__}"
            )
        transforms = []
        for i, item in enumerate(description):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise ValueError(
                    f'item {i} of the pipeline description must be an object with a "name" '
                    f'(and optional "params"), got {item!r}'
                )
            unknown = set(item) - {"name", "params"}
            if unknown:
                raise ValueError(
                    f"item {i} ({item['name']}) has unknown keys {sorted(unknown)}; "
                    'an item holds "name" and "params"'
                )
            params = item.get("params", {})
            if not isinstance(params, Mapping):
                raise ValueError(f"the params of item {i} ({item['name']}) must be an object, got {params!r}")
            transforms.append(rebuild(item["name"], params))
        return cls(*transforms)

    def outline(self) -> list[dict[str, Any]]:
        """The description with each transform's relations (:meth:`Transform.outline`)."""
        return [t.outline() for t in self.transforms]

    @classmethod
    def from_outline(cls, outline: Iterable[Mapping[str, Any]]) -> Pipeline:
        """The pipeline an outline (or a description) names, built without torch (:func:`outlined`).

        Equal to the pipeline it outlines; applied, each transform is rebuilt
        from the registry first.
        """
        return cls(*(outlined(item) for item in outline))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pipeline):
            return NotImplemented
        return self.transforms == other.transforms

    def __hash__(self) -> int:
        return hash(self.transforms)

    def __repr__(self) -> str:
        if not self.transforms:
            return "Pipeline: (identity)"
        return "Pipeline: " + " -> ".join(map(repr, self.transforms))
