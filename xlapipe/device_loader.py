"""torch_xla's prefetching ``MpDeviceLoader``, keeping the inner loader's interface and cleaning up.

The device loader uploads batches on background threads and issues the step
marker (``torch_xla.sync()``) before handing out each batch (or every
``batches_per_execution`` batches). A run iterates device loaders of its own
(:func:`xlapipe.session`), closed when its session ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sized
from typing import Any, cast

import torch
from torch_xla.distributed.parallel_loader import MpDeviceLoader, ParallelLoader

from xlapipe import runtime
from xlapipe.batches import map_tensors, tensors


class DeviceLoader(MpDeviceLoader):
    """``MpDeviceLoader`` that keeps the inner loader's interface and cleans up.

    ``len``, ``dataset``, ``batch_size``, ``sampler`` and ``set_epoch`` reach the
    inner loader. The device is resolved on first iteration (so the parent of
    forked replicas never touches it). Every iteration has its own worker
    threads, stopped when the loop ends, breaks or raises; iterations may
    overlap (a nested loop, ``zip``) without cutting each other short.
    """

    marks_step = True  # it issues the step marker before handing out each batch

    def __init__(self, loader: Iterable, device: torch.device | None = None, **options: Any):
        super().__init__(loader, device, **options)
        self._live: set[ParallelLoader] = set()
        self._lock = threading.Lock()
        if hasattr(loader, "consumed"):  # a run's loader that knows its position (loader_position.Tracked)
            loader.prefetched = True  # type: ignore[attr-defined]

    @property
    def loader(self) -> Iterable:
        loader: Iterable = self._loader
        return loader

    @property
    def options(self) -> dict[str, Any]:
        return dict(self._parallel_loader_kwargs)

    def copy(self, loader: Iterable | None = None) -> DeviceLoader:
        """A device loader with the same options over ``loader`` (default: the same inner loader)."""
        return copy_device_loader(self, self._loader if loader is None else loader)

    def __getattr__(self, name: str) -> Any:
        if name in (
            "dataset",
            "batch_size",
            "sampler",
            "batch_sampler",
            "drop_last",
            "collate_fn",
            "generator",
        ):
            return getattr(self.__dict__["_loader"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def set_epoch(self, epoch: int) -> None:
        """Forward to the inner loader's (or its sampler's) ``set_epoch``."""
        for target in (
            self._loader,
            getattr(self._loader, "sampler", None),
            getattr(getattr(self._loader, "batch_sampler", None), "sampler", None),
        ):
            if target is not None and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
                return
        raise AttributeError(
            f"{type(self._loader).__name__} and its sampler have no set_epoch; "
            "use a DistributedSampler (or a sampler with set_epoch) to reshuffle per epoch"
        )

    def __iter__(self) -> Iterator:
        device = self._device if self._device is not None else runtime.device()
        parallel = _ParallelLoader(self._loader, [device], **self._parallel_loader_kwargs)
        with self._lock:
            self._live.add(parallel)
        return self._batches(parallel, device)

    def _batches(self, parallel: ParallelLoader, device: torch.device) -> Iterator:
        consumed = getattr(self._loader, "consumed", None)  # the position of the batch handed out
        finished = False
        try:
            for batch in parallel.per_device_loader(device):
                if consumed is not None:
                    consumed()
                yield batch
            if consumed is not None:
                consumed()  # the end of the epoch
            finished = True
        finally:
            parallel.close()
            with self._lock:
                self._live.discard(parallel)
            if not finished and consumed is not None:
                self._loader.abandoned()

    def close(self) -> None:
        """Stop the worker threads of every iteration still running."""
        with self._lock:
            live, self._live = list(self._live), set()
        for parallel in live:
            parallel.close()


class _ParallelLoader(ParallelLoader):
    """``ParallelLoader`` whose inner-loader errors reach the training loop.

    torch_xla 2.9 lets an exception from the inner loader (a Dataset's
    ``__getitem__``, a collate function) kill its loader thread, and the epoch
    then just ends early. Here the exception, with its traceback, is raised
    where the loop asks for the next batch, and DataLoader worker processes
    are shut down at once.
    """

    def __init__(self, loader: Iterable, devices: list, **options: Any):
        super().__init__(_Reporting(loader, self), devices, **options)

    def send_cpu_data_to_device(self, batches: list, device: torch.device) -> list:
        """Upload every tensor of ``batches`` at once; each batch keeps its own structure.

        torch_xla's own upload turns named tuples into lists and leaves
        dataclasses on the host.
        """
        if isinstance(self._input_sharding, dict):
            sharded: list = super().send_cpu_data_to_device(batches, device)
            return sharded
        flat = [t for batch in batches for t in tensors(batch)]
        moved = iter(super().send_cpu_data_to_device(flat, device) if flat else [])
        return [map_tensors(batch, lambda _: next(moved)) for batch in batches]


class _Reporting:
    """Iterates ``loader``; an error goes to ``owner``'s exception queue and ends the iteration."""

    def __init__(self, loader: Iterable, owner: ParallelLoader):
        self.loader = loader
        self.owner = owner

    def __len__(self) -> int:
        return len(cast(Sized, self.loader))  # TypeError for a loader without a length, as len() on it

    def __iter__(self) -> Iterator:
        it = None
        try:
            it = iter(self.loader)
            yield from it
        except Exception as error:  # handed to the thread that consumes the batches
            shutdown = getattr(it, "_shutdown_workers", None)  # DataLoader worker processes
            if shutdown is not None:
                shutdown()
            self.owner._exception_queue.put(error)


def copy_device_loader(loader: MpDeviceLoader, inner: Iterable) -> DeviceLoader:
    """A :class:`DeviceLoader` with ``loader``'s device and options (any ``MpDeviceLoader``'s) over ``inner``."""
    return DeviceLoader(inner, loader._device, **loader._parallel_loader_kwargs)


def inner_loader(loader: Any) -> Any:
    """The loader a device loader feeds from (``loader`` itself when it is not one)."""
    seen: set[int] = set()
    while isinstance(loader, MpDeviceLoader) and id(loader) not in seen:
        seen.add(id(loader))
        loader = loader._loader
    return loader
