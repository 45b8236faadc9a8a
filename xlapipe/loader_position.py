"""Where a run is in each of its loaders, so that a checkpoint resumes at the next batch, exactly.

A run iterates its own copy of each loader. A ``torch.utils.data.DataLoader``
becomes torchdata's ``StatefulDataLoader`` with the same arguments (the same
dataset, sampler object, collate function, workers and generator, so the
batches and their order are the ones the DataLoader gives).

:class:`Tracked` notes, at each epoch's start, the generators the epoch draws
from: the loader's own and the host's process-global ones (Python's
``random``, NumPy's, torch's CPU generator). A resume inside an epoch of a
DataLoader replays it: those states put back, the epoch's iterator started and
the batches already trained on loaded again and dropped, so every draw of the
sampler, dataset, collate function and worker processes (seeded from the base
seed the main process draws) is made again; then the run's host generators are
put back (behind a prefetching device loader, as they were right after the
saved batch was loaded). It costs the loading of those batches. Where nothing
but torch's samplers can draw (:func:`draws_only_from_its_samplers`),
torchdata's fast-forward at the index level is exact and loads nothing: it is
used, with the order drawn again from the epoch's starting generators. A
dataset reading the wall clock, ``os.urandom`` or a generator of its own
cannot be replayed, and cannot be detected.

The position is the one of the batch *handed to the training loop*: behind a
device loader that prefetches, the state is taken per batch on the loader's
thread and matched to the batch when the loop receives it. Lists and tuples of
batches resume by index, and any other loader with ``state_dict``/
``load_state_dict`` (torchdata's ``Stateful``) by its own state; for any other
iterable the position inside an epoch is unknown, and a checkpoint there is
refused. A position also records what defines the loader's batches
(:func:`facts`), and a restore into another loader is refused by field.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from xlapipe.host_rng import host_rng_state, set_host_rng_state

# DataLoader's constructor arguments that a copy keeps as they were (besides dataset and sampling).
KEPT = (
    "num_workers",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def copy_loader(loader: DataLoader, cls: type = DataLoader, **changes: Any) -> Any:
    """A new ``cls`` loader with ``loader``'s arguments (its sampler objects kept), ``changes`` applied.

    ``changes`` may give ``collate_fn`` and ``drop_last`` (the latter only where
    the loader batches with ``batch_size``).
    """
    kept = {k: getattr(loader, k) for k in KEPT if hasattr(loader, k)}
    collate = changes.pop("collate_fn", loader.collate_fn)
    drop_last = changes.pop("drop_last", loader.drop_last)
    if changes:
        raise TypeError(f"copy_loader: unknown changes {sorted(changes)}")
    if isinstance(loader.dataset, IterableDataset):
        return cls(
            loader.dataset, batch_size=loader.batch_size, collate_fn=collate, drop_last=drop_last, **kept
        )
    if loader.batch_size is not None or loader.batch_sampler is None:
        return cls(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=loader.sampler,
            collate_fn=collate,
            drop_last=drop_last,
            **kept,
        )
    if drop_last and not loader.drop_last:
        raise ValueError(
            "copy_loader: a loader with its own batch_sampler cannot be made to drop its last batch"
        )
    return cls(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=collate, **kept)


def stateful(loader: Any) -> Any:
    """The loader a run iterates for ``loader``: a ``StatefulDataLoader`` for a plain ``DataLoader``."""
    if type(loader) is not DataLoader:  # a subclass may iterate its own way: kept
        return loader
    from torchdata.stateful_dataloader import StatefulDataLoader

    return copy_loader(loader, StatefulDataLoader)


def _has_state(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _parts(loader: Any) -> list[tuple[str, Any]]:
    """(path, object) for the loader and the samplers it draws from, each object once."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (
        ("loader", loader),
        ("sampler", getattr(loader, "sampler", None)),
        ("batch_sampler", batch_sampler),
        ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
    )
    seen: set[int] = set()
    parts = []
    for path, obj in candidates:
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            parts.append((path, obj))
    return parts


def _generators(loader: Any) -> dict[str, torch.Generator]:
    found: dict[str, torch.Generator] = {}
    for path, obj in _parts(loader):
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found.values()):
            found[path] = generator
    return found


def _has_epoch(obj: Any) -> bool:
    return callable(getattr(obj, "set_epoch", None)) and type(getattr(obj, "epoch", None)) is int


_BUILT_IN_SAMPLERS = (
    "torch.utils.data.sampler.SequentialSampler",
    "torch.utils.data.sampler.RandomSampler",
    "torch.utils.data.sampler.SubsetRandomSampler",
    "torch.utils.data.sampler.WeightedRandomSampler",
    "torch.utils.data.sampler.BatchSampler",
    "torch.utils.data.distributed.DistributedSampler",
    "torchdata.stateful_dataloader.sampler.RandomSampler",
    "torchdata.stateful_dataloader.sampler.BatchSampler",
    "torchdata.stateful_dataloader.sampler.StatefulDistributedSampler",
)


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def draws_only_from_its_samplers(loader: Any) -> bool:
    """True when nothing but torch's own samplers can draw random numbers while ``loader`` loads.

    A ``TensorDataset`` or a list of items, torch's samplers, the default
    collate function and no ``worker_init_fn``: then torchdata's fast-forward
    (at the index level, nothing loaded) is exact. For any other DataLoader it
    cannot be told whether the dataset, collate function or a worker draws, and
    a resume replays the epoch's batches instead.
    """
    from torch.utils.data import TensorDataset, default_collate, default_convert

    if not isinstance(loader, DataLoader) or type(loader.dataset) not in (TensorDataset, list, tuple):
        return False
    if any(_name(obj) not in _BUILT_IN_SAMPLERS for path, obj in _parts(loader) if path != "loader"):
        return False
    return loader.collate_fn in (default_collate, default_convert) and loader.worker_init_fn is None


def facts(loader: Any) -> dict[str, Any]:
    """What defines ``loader``'s batches: a checkpoint resumes only into a loader with the same ones."""
    if isinstance(loader, Sequence):
        return {"kind": "a list of batches", "batches": len(loader)}
    if not isinstance(loader, DataLoader):
        found: dict[str, Any] = {"kind": f"a {type(loader).__name__}"}
        with contextlib.suppress(TypeError):
            found["batches"] = len(loader)
        return found
    batch_sampler = loader.batch_sampler
    found = {
        "kind": "a DataLoader",
        "batch_size": loader.batch_size
        if loader.batch_size is not None
        else getattr(batch_sampler, "batch_size", None),
        "drop_last": loader.drop_last
        if loader.batch_size is not None
        else getattr(batch_sampler, "drop_last", None),
        "sampler": type(getattr(batch_sampler, "sampler", None) or loader.sampler).__name__,
        "dataset_length": None,
        "batches": None,
    }
    with contextlib.suppress(TypeError, NotImplementedError):
        found["dataset_length"] = len(loader.dataset)  # type: ignore[arg-type]
    with contextlib.suppress(TypeError, NotImplementedError):
        found["batches"] = len(loader)
    return found


_HOW = {
    "kind": "give the run the kind of loader the saving run had",
    "batch_size": "build the DataLoader with the saving run's batch_size",
    "drop_last": "build the DataLoader with the saving run's drop_last",
    "sampler": "build the DataLoader with the saving run's shuffle= and sampler= "
    "(shuffle=True is a RandomSampler, shuffle=False a SequentialSampler)",
    "dataset_length": "give the DataLoader the saving run's dataset (the same items)",
    "batches": "give the run the loader of the saving run (the same batches)",
}


class _Mark:
    """Where the batch handed out last came from."""

    __slots__ = ("after", "done", "position")

    def __init__(self, done: int, position: Any, after: dict[str, Any] | None) -> None:
        self.done = done  # batches handed out in the epoch, this one included
        self.position = position  # the index, or the loader's own state after it
        self.after = after  # the host's generators right after it was loaded (a prefetching loader)


class Tracked:
    """A run's loader: it iterates the loader and knows where the last batch handed out came from."""

    def __init__(self, name: str, loader: Iterable) -> None:
        self.name = name
        self.loader = stateful(loader)
        self.prefetched = False  # a device loader iterates it ahead of the training loop
        self._pending: collections.deque = collections.deque()  # marks fetched, not handed out
        self._mark: _Mark | None = None  # the last batch handed out (None: at an epoch's boundary)
        self._epoch_start: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None  # a restored position, for the next iteration
        self._generation = 0  # iterations started
        self._iterator: Iterator[Any] | None = None  # the loader's iterator of the running iteration
        self._replays: bool | None = None

    # -- the loader's face ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)  # TypeError for a loader without one, as len() gives

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("loader", "name", "prefetched"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader's (or its sampler's) ``set_epoch``, e.g. a ``DistributedSampler``'s."""
        for _, obj in _parts(self.loader):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)
                return
        raise AttributeError(
            f"loader {self.name!r} ({type(self.loader).__name__}) and its samplers have no set_epoch; "
            "use a DistributedSampler (or a sampler with set_epoch) to reshuffle per epoch"
        )

    # -- iterating ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._generation += 1
        generation = self._generation
        resume, self._resume = self._resume, None
        self._pending.clear()
        finished = False
        try:
            if resume is not None and resume["position"] is not None:
                batches = self._resumed(resume)
            else:
                self._epoch_start = self._rng()
                batches = self._positioned(self._iterate(self.loader), 0)
            for mark, batch in batches:
                self._pending.append((generation, mark))
                if not self.prefetched:
                    self.consumed()
                yield batch
            self._pending.append((generation, None))
            if not self.prefetched:
                self.consumed()
            finished = True
        finally:
            if not self.persistent:
                self._stop_workers()  # the loader keeps its iterator: end its worker processes now
            if not finished and not self.prefetched and generation == self._generation:
                self.abandoned()

    @property
    def replays(self) -> bool:
        """Whether a resume inside an epoch replays the epoch's batches (see :func:`draws_only_from_its_samplers`)."""
        if self._replays is None:
            self._replays = isinstance(self.loader, DataLoader) and not draws_only_from_its_samplers(
                self.loader
            )
        return self._replays

    def _resumed(self, resume: Mapping[str, Any]) -> Iterator[tuple[_Mark, Any]]:
        """The rest of the epoch a checkpoint was saved in, drawn again from the epoch's start."""
        start = resume["epoch_start"]
        self._epoch_start = start
        done = int(resume["batches"])
        if isinstance(self.loader, Sequence):
            return self._positioned(self._iterate(self.loader[done:]), done)
        if self.replays:
            return self._positioned(self._replayed(start, done, resume["after"]), done)
        # Fast-forward by the loader's own state; only the sampler's draw of the epoch's order (at
        # its first index) is drawn again, from torch's generators as they stood at the epoch's start.
        global_now = torch.get_rng_state()
        torch.set_rng_state(start["host"]["torch"])
        self._set_generators(start["generators"])
        try:
            self.loader.load_state_dict(resume["position"])
            it = self._iterate(self.loader)
            first = [next(it)]
        except StopIteration:
            first, it = [], iter(())
        finally:
            torch.set_rng_state(global_now)  # the loader's own generators go on from the epoch's start
        return self._positioned(_chain(first, it), done)

    def _replayed(
        self, start: Mapping[str, Any], done: int, after: Mapping[str, Any] | None
    ) -> Iterator[Any]:
        """The epoch's iterator, started from the generators of the epoch's start, its first ``done``
        batches loaded again and dropped: every draw the sampler, dataset, collate function and
        workers made is made again. Then the host's generators are put back: as the restore left them
        (the run's, at the save), or, behind a prefetching device loader, as they were right after the
        saved batch was loaded (the run's were moved on by the batches loaded ahead of it)."""
        now = host_rng_state()
        set_host_rng_state(start["host"])
        self._set_generators(start["generators"])
        if getattr(self.loader, "next_iter_state", None) is not None:
            self.loader.next_iter_state = None  # a fresh epoch, not a fast-forward
        try:
            it = self._iterate(self.loader)
            for replayed in range(done):
                try:
                    next(it)
                except StopIteration:
                    raise RuntimeError(
                        f"loader {self.name!r} ran out after {replayed} batches while its first {done} were "
                        "replayed to resume the checkpoint's epoch: it gives other batches than the "
                        "saving run's did (its dataset or sampler changed)"
                    ) from None
        finally:
            set_host_rng_state(after if after is not None and self.prefetched else now)
        return it

    def _iterate(self, loader: Iterable) -> Iterator[Any]:
        it = iter(loader)
        self._iterator = it
        return it

    @property
    def persistent(self) -> bool:
        return bool(getattr(self.loader, "persistent_workers", False))

    def _stop_workers(self) -> None:
        it, self._iterator = self._iterator, None
        stop = getattr(it, "_shutdown_workers", None)  # a DataLoader iterator with worker processes
        if callable(stop):
            stop()

    def close(self) -> None:
        """The run ends: stop any worker processes the loader still has (persistent ones included)."""
        self._stop_workers()
        live = getattr(self.loader, "_iterator", None)  # StatefulDataLoader keeps its last iterator
        stop = getattr(live, "_shutdown_workers", None)
        if callable(stop):
            stop()

    def _positioned(self, it: Iterator[Any], done: int) -> Iterator[tuple[_Mark, Any]]:
        for batch in it:
            done += 1
            after = host_rng_state() if self.prefetched and self.replays else None  # ~0.1-0.5 ms
            yield _Mark(done, self._here(done), after), batch

    def _here(self, done: int) -> Any:
        if isinstance(self.loader, Sequence):
            return done
        if _has_state(self.loader):
            return self.loader.state_dict()
        return _UNKNOWN

    def consumed(self) -> None:
        """The training loop received the next batch (or the end of the epoch)."""
        while self._pending:
            generation, mark = self._pending.popleft()
            if generation == self._generation:  # not a batch of an iteration left before
                self._mark = mark
                return

    def abandoned(self) -> None:
        """The loop left its epoch early: the next iteration starts a new epoch, as it would have."""
        self._pending.clear()
        self._mark = None

    def _rng(self) -> dict[str, Any]:
        return {
            "host": host_rng_state(),
            "generators": {path: g.get_state() for path, g in _generators(self.loader).items()},
        }

    def _set_generators(self, states: Mapping[str, torch.Tensor]) -> None:
        for path, g in _generators(self.loader).items():
            g.set_state(states[path])

    # -- what a checkpoint carries ------------------------------------------------------------
    @property
    def inside_epoch(self) -> bool:
        return self._mark is not None

    def why_not_resumable(self) -> str | None:
        """Why a checkpoint taken now could not resume this loader exactly (None when it can)."""
        unknown = self._mark is not None and self._mark.position is _UNKNOWN
        return self.why_not_resumable_inside_epoch() if unknown else None

    def why_not_resumable_inside_epoch(self) -> str | None:
        """Why a checkpoint taken inside an epoch could not resume this loader (None when it could)."""
        if isinstance(self.loader, Sequence) or _has_state(self.loader):
            return None
        return (
            f"loader {self.name!r} is a {type(self.loader).__name__}, whose position inside an epoch "
            "xlapipe cannot know or restore. Save at an epoch's boundary, or give a DataLoader, a "
            "list of batches, or a loader with state_dict()/load_state_dict() (torchdata's "
            "StatefulDataLoader)"
        )

    def _current(self) -> dict[str, Any]:
        current: dict[str, Any] = {}
        for path, obj in _parts(self.loader):
            generator = getattr(obj, "generator", None)
            if isinstance(generator, torch.Generator):
                current[f"{path}.generator"] = generator.get_state()
            if _has_epoch(obj):
                current[f"{path}.epoch"] = obj.epoch
                if type(getattr(obj, "seed", None)) is int:
                    current[f"{path}.seed"] = obj.seed
        return current

    def state_dict(self) -> dict[str, Any]:
        """The position (None at a boundary) and batches handed out in the epoch, the epoch's starting
        random state (and the host's right after the batch, behind a prefetching device loader), the
        generators and samplers' epochs, and the loader's defining facts."""
        problem = self.why_not_resumable()
        if problem is not None:
            raise ValueError(f"checkpoint.save inside an epoch: {problem}")
        mark = self._mark
        return {
            "position": mark.position if mark is not None else None,
            "batches": mark.done if mark is not None else 0,
            "epoch_start": self._epoch_start if mark is not None else None,
            "after": mark.after if mark is not None else None,
            "current": self._current(),
            "facts": facts(self.loader),
        }

    def mismatch(self, saved: Mapping[str, Any]) -> str | None:
        """Why ``saved`` cannot be put into this loader (None when it can)."""
        if not isinstance(saved, Mapping) or set(saved) != set(_STATE_KEYS):
            return (
                f"the checkpoint's state of loader {self.name!r} is not one this xlapipe writes (an earlier "
                "xlapipe did not record the loader's batch size, sampler and length, nor the random state "
                "a resume replays the epoch from). Resume with the xlapipe that wrote it, or take its "
                "weights: run.model.load_state_dict(checkpoint.load(path)['model'])"
            )
        mine = facts(self.loader)
        for key in (*_HOW, *sorted(set(saved["facts"]) | set(mine) - set(_HOW))):
            was, now = saved["facts"].get(key), mine.get(key)
            if was != now:
                return (
                    f"loader {self.name!r} is not the loader the checkpoint was saved with: its {key} was "
                    f"{was!r} and is {now!r} in this run. To resume, {_HOW.get(key, 'build it as the saving run did')}"
                    "; to go on with another loader on purpose, take the checkpoint's weights only: "
                    "run.model.load_state_dict(checkpoint.load(path)['model'])"
                )
        current = self._current()
        if set(saved["current"]) != set(current):
            return (
                f"loader {self.name!r}: the checkpoint holds the random state of {sorted(saved['current'])} "
                f"and this run's loader has {sorted(current)}. Build the loaders as the saving run did: the "
                "same names, shuffle=, generator= and sampler= (a loader's own generator, a sampler's "
                "generator, a DistributedSampler's epoch and seed)"
            )
        for key, value in saved["current"].items():
            now = current[key]
            if isinstance(now, torch.Tensor) and not (
                isinstance(value, torch.Tensor) and value.shape == now.shape and value.dtype == now.dtype
            ):
                return (
                    f"loader {self.name!r}'s {key} in the checkpoint is not a state of this run's generator"
                )
            if not isinstance(now, torch.Tensor) and type(value) is not int:
                return f"loader {self.name!r}'s {key} in the checkpoint is {value!r}, not an int"
        if saved["position"] is not None and not (
            _has_state(self.loader) or isinstance(self.loader, Sequence)
        ):
            return (
                f"the checkpoint was saved inside an epoch of loader {self.name!r}, and this run's loader "
                f"({type(self.loader).__name__}) cannot be positioned there"
            )
        return None

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Put back the generators and samplers' epochs; the next iteration resumes at the position."""
        for key, value in saved["current"].items():
            path, _, field = key.rpartition(".")
            obj = dict(_parts(self.loader))[path]
            if field == "generator":
                obj.generator.set_state(value)
            elif field == "epoch":
                obj.set_epoch(value)
            else:
                setattr(obj, field, value)
        inside = saved["position"] is not None
        self._mark = _Mark(int(saved["batches"]), saved["position"], saved["after"]) if inside else None
        self._epoch_start = saved["epoch_start"]
        self._resume = dict(saved) if inside else None

    def warn_if_not_restorable(self) -> None:
        """Warn when a checkpoint cannot hold the loader's randomness (persistent worker processes)."""
        inner = self.loader
        if getattr(inner, "persistent_workers", False) and getattr(inner, "num_workers", 0) > 0:
            warnings.warn(
                f"checkpoint: loader {self.name!r} keeps persistent worker processes; their random state "
                "(and the workers' base seed, drawn once for the loader's life) is not in the "
                "checkpoint, so a resumed run may draw other samples or augmentations than an "
                "uninterrupted one. Set persistent_workers=False for an exact resume.",
                RuntimeWarning,
                stacklevel=4,
            )


_STATE_KEYS = ("position", "batches", "epoch_start", "after", "current", "facts")


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown position>"


_UNKNOWN = _Unknown()


def _chain(first: list, rest: Iterator[Any]) -> Iterator[Any]:
    yield from first
    yield from rest
