"""The imperative shell: apply a setup's effects, realise it into a Run, undo it all on exit."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch_xla.distributed.parallel_loader import MpDeviceLoader
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

from xlapipe import effects, placement, runtime
from xlapipe.device_loader import copy_device_loader, inner_loader
from xlapipe.effects import EnvVar
from xlapipe.hooks import Hook
from xlapipe.loader_position import Tracked
from xlapipe.run import Run
from xlapipe.training_setup import TrainingSetup


@contextlib.contextmanager
def session(setup: TrainingSetup) -> Iterator[Run]:
    """Apply the setup's process-wide effects, realise it, restore everything on exit.

    Environment effects are applied before anything touches the XLA device,
    so ``XLA_USE_BF16`` and friends are seen when the runtime starts. On exit,
    normal or not, the run's hooks are closed (device loaders stopped), the
    run refuses further steps, and every effect is undone. When the code inside
    raises (Ctrl-C included), the weights of the last completed step are kept
    on the CPU first (``run.copy_weights_to`` works after the block), and an
    error while closing is added to that error's notes instead of hiding it.
    """
    if not isinstance(setup, TrainingSetup):
        raise TypeError(f"session takes a TrainingSetup, got {type(setup).__name__}")
    setup = harnessed(setup)
    with effects.applied(setup.effects):
        run = realize(setup)
        try:
            yield run
        except BaseException as error:
            run.failed = True
            run.keep_weights(error)
            try:
                run.close()
            except Exception as also:  # noqa: BLE001 - the first error is the one to see
                effects.note(error, f"while closing the session after it: {type(also).__name__}: {also}")
            # A failed step leaves device tensors whose graph may never run (an execution error)
            # alive in the run and in reference cycles through the traceback; the next step marker
            # would try to sync them. Drop them now.
            run.release()
            gc.collect()
            raise
        run.close()


HARNESS = "XLAPIPE_HARNESS"


def harnessed(setup: TrainingSetup) -> TrainingSetup:
    """``setup`` as the harness named by ``$XLAPIPE_HARNESS`` (``module:function``) returns it.

    A tool that runs the user's script unchanged (``xlapipe ablate``, ``xlapipe
    doctor``) sets it in the script's process: the function gets every setup a
    session is opened with and returns the one to train (another pipeline
    applied to ``setup.base``, a practice that measures added). Unset: ``setup``.
    """
    name = os.environ.get(HARNESS)
    if not name:
        return setup
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"{HARNESS}={name!r} names no importable module:function ({error})") from error
    out = fn(setup)
    if not isinstance(out, TrainingSetup):
        raise TypeError(f"the harness {name} returned a {type(out).__name__}, not a TrainingSetup")
    return out


def realize(setup: TrainingSetup) -> Run:
    """Move a copy of the model (and its optimizer) to the setup's device; start the hooks.

    The user's model, optimizer and loaders are never changed, so a setup can
    be realised again (by another replica, or another variant).
    """
    for hook in setup.hooks:
        hook.before_placement(setup)
    _refuse_attached_scheduler(setup)
    device = runtime.device() if setup.device == "xla" else torch.device("cpu")
    if setup.device == "xla":
        runtime.check_startup_env({e.name: e.value for e in setup.effects if isinstance(e, EnvVar)})
    elif any(t.device.type == "xla" for t in setup.module.state_dict().values()):
        raise ValueError(
            "the model's weights are on the XLA device, and the pipeline has no with_device: the "
            "session would train a copy on the CPU. Add with_device() to the pipeline (and build the "
            "model on the CPU: xlapipe moves a copy of it)."
        )
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
        model, mapping = placement.move(setup.module, device, setup.precision.weight_dtype)
    for hook in setup.hooks:
        hook.after_placement(model)
    optimizer = placement.build_optimizer(setup.optimizer, model, mapping)
    run = Run(
        setup=setup,
        model=model,
        optimizer=optimizer,
        scheduler=_build_scheduler(setup, optimizer),
        loaders=run_loaders(setup.loaders),
        device=device,
        precision=setup.precision,
        scaler=torch.amp.GradScaler(device.type) if setup.precision.uses_scaler else None,
    )
    started: list[Hook] = []
    try:
        for hook in setup.hooks:
            started.append(hook.start(run))
    except BaseException:
        run.hooks = tuple(started)
        with contextlib.suppress(Exception):  # the error that stopped the start is the one to see
            run.close()
        raise
    run.started(tuple(started), tuple(t.name for t in setup.applied for _ in t.hooks))
    try:
        for hook in run.hooks:
            hook.after_start()
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the start is the one to see
            run.close()
        raise
    return run


def run_loaders(loaders: Mapping[str, Any]) -> dict[str, Any]:
    """The run's own loaders: each knows its position (for checkpoints); device loaders are new ones."""
    out: dict[str, Any] = {}
    for name, loader in loaders.items():
        tracked = Tracked(name, inner_loader(loader))
        out[name] = copy_device_loader(loader, tracked) if isinstance(loader, MpDeviceLoader) else tracked
    return out


def _refuse_attached_scheduler(setup: TrainingSetup) -> None:
    if hasattr(getattr(setup.optimizer, "step", None), "_wrapped_by_lr_sched"):
        raise ValueError(
            "a learning-rate scheduler was built on the optimizer in this setup (torch marks an "
            "optimizer's step when an LRScheduler wraps it). xlapipe trains a copy of that "
            "optimizer, on the run's copy of the model, which your scheduler would never step: "
            "it would train at the unscheduled rate. Give the scheduler as a function of the "
            "optimizer instead, and build none on your own: TrainingSetup(model, optimizer, "
            "loaders, scheduler=lambda opt: get_linear_schedule_with_warmup(opt, 100, total)); "
            "the run's scheduler is run.scheduler."
        )


def _build_scheduler(setup: TrainingSetup, optimizer: torch.optim.Optimizer | None) -> Any:
    if setup.scheduler is None:
        return None
    if optimizer is None:
        raise ValueError("TrainingSetup(scheduler=...) needs an optimizer to schedule: give optimizer=...")
    scheduler = setup.scheduler(optimizer)
    if not (callable(getattr(scheduler, "step", None)) and callable(getattr(scheduler, "state_dict", None))):
        raise TypeError(
            f"the scheduler function returned a {type(scheduler).__name__}, which has no step() and "
            "state_dict(); it must build a scheduler on the optimizer it is given, e.g. "
            "scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt, ...)"
        )
    return scheduler
