"""The one training step every example and benchmark uses."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from xlapipe.session import LossFn, Run


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (nested dicts, lists, tuples) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def train_step(run: Run, batch: Any, loss_fn: LossFn) -> torch.Tensor:
    """Forward and loss under the precision policy, backward, optimizer step.

    Gradients are reduced across replicas (``xm.optimizer_step``) on XLA, and
    exactly one step marker is issued per step: by the device loader when the
    batches come from one (``wrap_loader_mp``), here otherwise. Returns the
    loss, detached (reading it forces a device-to-host transfer).
    """
    if run.optimizer is None:
        raise ValueError("train_step needs an optimizer: give TrainingSetup(optimizer=...)")
    on_xla = run.device.type == "xla"
    guard = run.setup.recompile_guard
    if guard is not None:
        guard.before_step(run, batch)
    if not run.loader_syncs:
        batch = to_device(batch, run.device)
    run.optimizer.zero_grad(set_to_none=True)
    if run.setup.compile_backend:
        from xlapipe.transforms.compile_step import compiles_optimizer, forward, update

        loss = forward(run, loss_fn)(batch)
    else:
        with run.precision.autocast(run.device):
            loss = loss_fn(run.model, batch)
    if run.scaler is not None:
        _backward(run.scaler.scale(loss))
        if on_xla:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(run.optimizer)
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        _backward(loss)
        if run.setup.compile_backend and compiles_optimizer(run):
            update(run)
        elif on_xla:
            import torch_xla.core.xla_model as xm

            xm.optimizer_step(run.optimizer)
        else:
            run.optimizer.step()
    if on_xla and not run.loader_syncs:
        import torch_xla

        torch_xla.sync()
    if guard is not None:
        guard.after_step(run, batch)
    return loss.detach()


def _backward(loss: torch.Tensor) -> None:
    try:
        loss.backward()
    except RuntimeError as error:
        if "device_ready_queues_" not in str(error):
            raise
        raise RuntimeError(
            "PyTorch's autograd engine started (a backward pass ran) before "
            "torch_xla's runtime did, so it has no queue for the XLA device. "
            "Start the runtime first in this process (torch_xla.device(), or "
            "xlapipe.session on a setup with with_device) or run the XLA variant "
            "in its own process."
        ) from error
