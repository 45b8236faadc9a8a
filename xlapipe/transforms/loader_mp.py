"""wrap_loader_mp: feed batches through torch_xla's prefetching ``MpDeviceLoader``.

The device loader uploads batches on background threads and issues the step
marker (``torch_xla.sync()``) before handing out each batch, so the training
loop and the inner loader do neither. Anything that changes the loaders
(e.g. ``static_shapes``) must come before it.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch_xla.distributed.parallel_loader import MpDeviceLoader, ParallelLoader

from xlapipe import runtime
from xlapipe.transform import Transform, register
from xlapipe.training_setup import TrainingSetup


class DeviceLoader(MpDeviceLoader):
    """``MpDeviceLoader`` that keeps the inner loader's interface and cleans up.

    ``len``, ``dataset``, ``batch_size``, ``sampler`` and ``set_epoch`` reach the
    inner loader. The device is resolved on first iteration (so the parent of
    forked replicas never touches it), and leaving a loop early stops the
    worker threads.
    """

    def __init__(self, loader: Iterable, device: torch.device | None = None, **options: Any):
        super().__init__(loader, device, **options)

    @property
    def loader(self) -> Iterable:
        return self._loader

    @property
    def options(self) -> dict[str, Any]:
        return dict(self._parallel_loader_kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "batch_size", "sampler", "batch_sampler", "drop_last", "collate_fn"):
            return getattr(self.__dict__["_loader"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def set_epoch(self, epoch: int) -> None:
        """Forward to the inner loader's (or its sampler's) ``set_epoch``."""
        for target in (self._loader, getattr(self._loader, "sampler", None),
                       getattr(getattr(self._loader, "batch_sampler", None), "sampler", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
                return
        raise AttributeError(
            f"{type(self._loader).__name__} and its sampler have no set_epoch; "
            "use a DistributedSampler (or a sampler with set_epoch) to reshuffle per epoch"
        )

    def __iter__(self) -> Iterator:
        self.close()
        device = self._device if self._device is not None else runtime.device()
        self._parallel_loader = _ParallelLoader(self._loader, [device], **self._parallel_loader_kwargs)
        return self._batches(self._parallel_loader, device)

    @staticmethod
    def _batches(parallel: ParallelLoader, device: torch.device) -> Iterator:
        try:
            yield from parallel.per_device_loader(device)
        finally:
            parallel.close()

    def close(self) -> None:
        """Stop the worker threads of the current iteration, if any."""
        if self._parallel_loader is not None:
            self._parallel_loader.close()
            self._parallel_loader = None


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


class _Reporting:
    """Iterates ``loader``; an error goes to ``owner``'s exception queue and ends the iteration."""

    def __init__(self, loader: Iterable, owner: ParallelLoader):
        self.loader = loader
        self.owner = owner

    def __len__(self) -> int:
        return len(self.loader)

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


def _wrap(setup: TrainingSetup, **options: Any) -> TrainingSetup:
    return setup.evolve(loaders={
        name: loader if isinstance(loader, MpDeviceLoader) else DeviceLoader(loader, **options)
        for name, loader in setup.loaders.items()
    })


@register
def wrap_loader_mp(
    loader_prefetch_size: int = 16,
    device_prefetch_size: int = 8,
    host_to_device_transfer_threads: int = 1,
) -> Transform:
    """Wrap every loader in ``MpDeviceLoader`` (already wrapped ones are kept)."""
    for key, value in (("loader_prefetch_size", loader_prefetch_size),
                       ("device_prefetch_size", device_prefetch_size),
                       ("host_to_device_transfer_threads", host_to_device_transfer_threads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"wrap_loader_mp: {key} must be a positive int, got {value!r}")
    return Transform(
        "wrap_loader_mp",
        _wrap,
        {
            "loader_prefetch_size": loader_prefetch_size,
            "device_prefetch_size": device_prefetch_size,
            "host_to_device_transfer_threads": host_to_device_transfer_threads,
        },
        needs=("with_device",),
        after=("static_shapes",),
    )
