"""The imperative shell: realise a setup (effects, moves) and hand back a Run."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from attrs import field, frozen
from torch import nn
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

from xlapipe import effects, placement, runtime
from xlapipe.precision import Precision
from xlapipe.training_setup import TrainingSetup

LossFn = Callable[[nn.Module, Any], torch.Tensor]


@frozen
class Run:
    """A realised setup: the model on its device, effects in force."""

    setup: TrainingSetup
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    loaders: Mapping[str, Iterable]
    device: torch.device
    precision: Precision
    scaler: torch.amp.GradScaler | None
    loader_syncs: bool
    state: dict[str, Any] = field(factory=dict)  # per-run mutable state (compiled step, guards)

    def step(self, batch: Any, loss_fn: LossFn) -> torch.Tensor:
        """One training step; see :func:`xlapipe.step.train_step`."""
        from xlapipe.step import train_step

        return train_step(self, batch, loss_fn)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context for forward passes outside :meth:`step` (evaluation)."""
        return self.precision.autocast(self.device)


@contextlib.contextmanager
def session(setup: TrainingSetup) -> Iterator[Run]:
    """Apply the setup's process-wide effects, realise it, restore everything on exit.

    Environment effects are applied before anything touches the XLA device,
    so ``XLA_USE_BF16`` and friends are seen when the runtime starts.
    """
    if not isinstance(setup, TrainingSetup):
        raise TypeError(f"session takes a TrainingSetup, got {type(setup).__name__}")
    with effects.applied(setup.effects):
        run = realize(setup)
        try:
            yield run
        finally:
            for loader in run.loaders.values():
                if hasattr(loader, "close"):
                    loader.close()


def realize(setup: TrainingSetup) -> Run:
    """Move a copy of the model (and its optimizer) to the setup's device.

    The user's model and optimizer are never changed, so a setup can be
    realised again (by another replica, or another variant).
    """
    if setup.spmd is not None:  # shard_data: use_spmd() before any tensor is on the device
        setup.spmd.activate()  # process-wide, cannot be undone
    device = runtime.device() if setup.device == "xla" else torch.device("cpu")
    dtype = setup.precision.weight_dtype
    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    if isinstance(setup.model, MpModelWrapper):
        devices = runtime.devices_per_process()
        if devices > 1:
            raise RuntimeError(
                "wrap_model_mp shares one module object per process, and this process "
                f"drives {devices} XLA devices as threads: every "
                "thread would move the same weights to its own device. Drop "
                "wrap_model_mp here (set CPU_NUM_DEVICES=1 on CPU), or use one "
                "process per device (TPU v4 and later)."
            )
        # MpModelWrapper.to moves its module in place under a process-shared
        # lock. Take the same lock and move a copy instead: replicas are
        # serialised as torch_xla intends, and the host copy stays intact.
        lock = setup.model._lock
    with lock:
        model, mapping = placement.move(setup.module, device, dtype)
    if setup.spmd is not None:
        setup.spmd.place(model)  # replicate or shard the parameters over the mesh
    optimizer = placement.build_optimizer(setup.optimizer, model, mapping)
    scaler = torch.amp.GradScaler(device.type) if setup.precision.uses_scaler else None
    return Run(
        setup=setup,
        model=model,
        optimizer=optimizer,
        loaders=dict(setup.loaders),
        device=device,
        precision=setup.precision,
        scaler=scaler,
        loader_syncs="wrap_loader_mp" in setup.applied_names,
    )
