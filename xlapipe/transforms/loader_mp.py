"""wrap_loader_mp: feed batches through torch_xla's prefetching ``MpDeviceLoader``.

The device loader uploads batches on background threads and issues the step
marker (``torch_xla.sync()``) before handing out each batch (or every
``batches_per_execution`` batches), so the training loop and the inner loader
do neither. Anything that changes the loaders (e.g. ``static_shapes``) must
come before it. Each session gets device loaders of its own, so two runs (or
two loops of one run) never stop each other's iterations.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen
from torch_xla.distributed.parallel_loader import MpDeviceLoader

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.device_loader import DeviceLoader
from xlapipe.hooks import Hook
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, practice, register


@frozen
class LoaderMarksSteps(Hook):
    """The hook: the device loader marks the step before handing out the next batch, so the step
    issues no marker of its own. (Each run iterates device loaders of its own: :func:`xlapipe.session`.)"""

    marks_step = True


def _wrap(setup: TrainingSetup, **options: Any) -> TrainingSetup:
    if not setup.loaders:
        raise ValueError(
            "wrap_loader_mp wraps the setup's loaders, and this setup has none: it would do nothing. Give "
            "the loader in TrainingSetup(model, optimizer, loaders={'train': loader}) and iterate "
            "run.batches('train'), or drop wrap_loader_mp (batches you feed to run.step yourself are "
            "moved to the device one by one)"
        )
    return setup.evolve(
        loaders={
            name: loader if isinstance(loader, MpDeviceLoader) else DeviceLoader(loader, **options)
            for name, loader in setup.loaders.items()
        }
    )


def _positive(name: str) -> checks.Validator:
    return checks.positive_int("wrap_loader_mp", name)


@frozen
class DeviceLoaderOptions:
    """The practice's parameters: ``MpDeviceLoader``'s options."""

    loader_prefetch_size: int = field(default=16, validator=_positive("loader_prefetch_size"))
    device_prefetch_size: int = field(default=8, validator=_positive("device_prefetch_size"))
    host_to_device_transfer_threads: int = field(
        default=1, validator=_positive("host_to_device_transfer_threads")
    )
    batches_per_execution: int = field(default=1, validator=_positive("batches_per_execution"))
    batchdim: int = field(default=0, validator=checks.non_negative_int("wrap_loader_mp", "batchdim"))


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
    options = DeviceLoaderOptions(
        loader_prefetch_size,
        device_prefetch_size,
        host_to_device_transfer_threads,
        batches_per_execution,
        batchdim,
    )
    return practice(
        "wrap_loader_mp",
        options,
        _wrap,
        needs=("with_device",),
        after=("static_shapes",),
        hooks=(LoaderMarksSteps(),),
    )


claims.declare(
    Claim(
        "wrap_loader_mp",
        wrap_loader_mp,
        summary="batches prefetched to the device by torch_xla's device loader, which marks the step",
    )
)
