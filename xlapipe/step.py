"""The one training step every example and benchmark uses, open to practices through hooks.

The step is forward (under the precision policy), backward, then the update:
gradients reduced across replicas, unscaled (fp16), ``on_gradients`` hooks
(clipping), the optimizer step, the gradient scaler's update, gradients
zeroed, the scheduler stepped; all of it inside the ``wrap_step`` hooks, and
still pending on the device when they return. Then exactly one step marker,
unless a hook places it (``Hook.marks_step``). Practices change it only through
:mod:`xlapipe.hooks`; nothing here knows any practice by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from xlapipe.batches import to_device
from xlapipe.hooks import Forward, Hook, Step

if TYPE_CHECKING:
    from xlapipe.run import LossFn, Run


def train_step(run: Run, batch: Any, loss_fn: LossFn) -> torch.Tensor:
    """One step of ``run`` on ``batch``; returns the loss, detached.

    Reading the returned loss (``float(loss)``) forces the device to finish
    the step and copy it back; to log without that, use ``log_every``.
    """
    run.check_open()
    if run.optimizer is None:
        raise ValueError("train_step needs an optimizer: give TrainingSetup(model, optimizer, ...)")
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be a function (model, batch) -> loss tensor, got {type(loss_fn).__name__}"
        )
    for hook in run.hooks:
        batch = hook.before_step(batch)
    batch = to_device(batch, run.device, run.precision.weight_dtype)
    run.values.clear()
    loss, updated = run.composed_step(loss_fn)(batch)
    run.steps += 1
    run.updates += int(updated)
    run.values["loss"] = loss
    if run.device.type == "xla" and not run.marks_step_elsewhere:
        run.mark_step()
    for hook in reversed(run.hooks):
        hook.after_step(batch, loss, updated)
    return loss


def fold(hooks: tuple[Hook, ...], wrap: str, fn: Callable) -> Callable:
    """``fn`` wrapped by each hook's ``wrap`` method, the first hook outermost."""
    for hook in reversed(hooks):
        fn = getattr(hook, wrap)(fn)
    return fn


def compose(run: Run, loss_fn: LossFn) -> Step:
    """The step function ``batch -> (loss, updated)`` for ``loss_fn``, wrapped by the run's hooks."""
    model, optimizer, scaler, hooks = run.model, run.optimizer, run.scaler, run.hooks
    assert optimizer is not None
    on_xla = run.device.type == "xla"

    def forward(batch: Any) -> torch.Tensor:
        with run.precision.autocast(run.device):
            return loss_fn(model, batch)

    def optimizer_step() -> None:
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()

    def update() -> bool:
        if on_xla:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)  # across replicas; nothing to do with one
        if scaler is not None:
            scaler.unscale_(optimizer)
        for hook in hooks:
            hook.on_gradients()
        wrapped_optimizer_step()
        if scaler is not None:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if run.scheduler is not None:
            run.scheduler.step()
        return True

    wrapped_forward: Forward = fold(hooks, "wrap_forward", forward)
    wrapped_optimizer_step = fold(hooks, "wrap_optimizer_step", optimizer_step)
    wrapped_update = fold(hooks, "wrap_update", update)

    def step(batch: Any) -> tuple[torch.Tensor, bool]:
        try:
            loss = check_loss(wrapped_forward(batch), loss_fn)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            updated = wrapped_update()
        except BaseException as error:
            optimizer.zero_grad(set_to_none=True)  # a failed step leaves no gradient behind
            if isinstance(error, RuntimeError) and "device_ready_queues_" in str(error):
                raise engine_started_first() from error
            raise
        return loss.detach(), updated

    return fold(hooks, "wrap_step", step)


def check_loss(loss: Any, loss_fn: Callable) -> torch.Tensor:
    """``loss`` if it is a scalar tensor autograd can differentiate; a clear error otherwise."""
    name = getattr(loss_fn, "__qualname__", "loss_fn")
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"{name} returned a {type(loss).__name__}; it must return the loss as a scalar tensor "
            "(e.g. torch.nn.functional.cross_entropy(model(x), y), or model(**batch).loss), not "
            "a Python number or None"
        )
    if loss.numel() != 1:
        raise ValueError(
            f"{name} returned a tensor of shape {tuple(loss.shape)}; the loss must be a scalar: "
            "reduce it (loss.mean() or loss.sum())"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"{name} returned a loss that does not depend on any trainable parameter (requires_grad "
            "is False): the loss was detached (.detach(), .item(), torch.no_grad()) or every "
            "parameter is frozen (requires_grad=False). Compute it from the model's output with "
            "gradients on, and leave at least one parameter trainable."
        )
    return loss


def engine_started_first() -> RuntimeError:
    """The error for a backward pass on XLA (in the step, or inside a scan's forward) that the
    autograd engine cannot run: it started before torch_xla's runtime did."""
    return RuntimeError(
        "PyTorch's autograd engine started (a backward pass ran) before "
        "torch_xla's runtime did, so it has no queue for the XLA device. "
        "Start the runtime before any backward pass in this process (call "
        "torch_xla.device() first, e.g. before training an eager reference), or "
        "run the XLA training in its own process."
    )
