"""wrap_loader_mp: feed batches through torch_xla's prefetching ``MpDeviceLoader``.

The device loader uploads batches on background threads and issues the step
marker (``torch_xla.sync()``) before handing out each batch (or every
``batches_per_execution`` batches), so the training loop and the inner loader
do neither. Anything that changes the loaders (e.g. ``static_shapes``) must
come before it. Each session gets device loaders of its own, so two runs (or
two loops of one run) never stop each other's iterations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sized
from typing import Any, cast

import torch
from attrs import frozen
from torch_xla.distributed.parallel_loader import MpDeviceLoader, ParallelLoader

from xlapipe import runtime
from xlapipe.batches import map_tensors, tensors
from xlapipe.hooks import Hook
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, register


class DeviceLoader(MpDeviceLoader):
    """``MpDeviceLoader`` that keeps the inner loader's interface and cleans up.

    ``len``, ``dataset``, ``batch_size``, ``sampler`` and ``set_epoch`` reach the
    inner loader. The device is resolved on first iteration (so the parent of
    forked replicas never touches it). Every iteration has its own worker
    threads, stopped when the loop ends, breaks or raises; iterations may
    overlap (a nested loop, ``zip``) without cutting each other short.
    """

    def __init__(self, loader: Iterable, device: torch.device | None = None, **options: Any):
        super().__init__(loader, device, **options)
        self._live: set[ParallelLoader] = set()
        self._lock = threading.Lock()

    @property
    def loader(self) -> Iterable:
        loader: Iterable = self._loader
        return loader

    @property
    def options(self) -> dict[str, Any]:
        return dict(self._parallel_loader_kwargs)

    def copy(self) -> DeviceLoader:
        """A device loader over the same inner loader with the same options, and no iterations."""
        return DeviceLoader(self._loader, self._device, **self._parallel_loader_kwargs)

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
        try:
            yield from parallel.per_device_loader(device)
        finally:
            parallel.close()
            with self._lock:
                self._live.discard(parallel)

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


@frozen
class OwnDeviceLoaders(Hook):
    """The hook: each run iterates device loaders of its own, closed when its session ends."""

    marks_step = True  # the device loader marks the step before handing out the next batch

    def start(self, run: Any) -> Hook:
        return _RunDeviceLoaders(run)


class _RunDeviceLoaders(Hook):
    marks_step = True

    def __init__(self, run: Any) -> None:
        self.loaders = []
        for name, loader in run.loaders.items():
            if isinstance(loader, DeviceLoader):
                run.loaders[name] = loader.copy()
                self.loaders.append(run.loaders[name])

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()


def _wrap(setup: TrainingSetup, **options: Any) -> TrainingSetup:
    return setup.evolve(
        loaders={
            name: loader if isinstance(loader, MpDeviceLoader) else DeviceLoader(loader, **options)
            for name, loader in setup.loaders.items()
        }
    )


@register
def wrap_loader_mp(
    loader_prefetch_size: int = 16,
    device_prefetch_size: int = 8,
    host_to_device_transfer_threads: int = 1,
    batches_per_execution: int = 1,
    batchdim: int = 0,
) -> Transform:
    """Wrap every loader in ``MpDeviceLoader`` (already wrapped ones are kept).

    The options are ``MpDeviceLoader``'s: queue sizes, upload threads,
    ``batches_per_execution`` (one step marker every K batches: K steps traced
    into one graph) and ``batchdim`` (the dimension holding the batch).
    """
    for key, value, least in (
        ("loader_prefetch_size", loader_prefetch_size, 1),
        ("device_prefetch_size", device_prefetch_size, 1),
        ("host_to_device_transfer_threads", host_to_device_transfer_threads, 1),
        ("batches_per_execution", batches_per_execution, 1),
        ("batchdim", batchdim, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            kind = "a positive int" if least else "a non-negative int"
            raise ValueError(f"wrap_loader_mp: {key} must be {kind}, got {value!r}")
    return Transform(
        "wrap_loader_mp",
        _wrap,
        {
            "loader_prefetch_size": loader_prefetch_size,
            "device_prefetch_size": device_prefetch_size,
            "host_to_device_transfer_threads": host_to_device_transfer_threads,
            "batches_per_execution": batches_per_execution,
            "batchdim": batchdim,
        },
        needs=("with_device",),
        after=("static_shapes",),
        hooks=(OwnDeviceLoaders(),),
    )
