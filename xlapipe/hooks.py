"""The one protocol through which a practice takes part in realising a setup and in the step.

A transform records :class:`Hook` values; :func:`xlapipe.session` calls them at
fixed points, in pipeline order; what comes *after* something (``after_step``,
``close``) runs in reverse order, and the ``wrap_*`` hooks nest, the first
transform's wrapper outermost. A wrapper always calls what it wraps (the step
checks it). Every method does nothing by default: a practice overrides the few
it needs. Per-run state belongs to the object :meth:`Hook.start` returns, and
survives a checkpoint through its :meth:`Hook.state_dict`.

The points, in the order a run meets them::

    before_placement(setup)     the model is still on the host (e.g. turn SPMD on)
    after_placement(model)      the model is on its device, the optimizer not built yet
    start(run) -> Hook          the run exists: return the hook's per-run part (self if stateless)
    after_start()               every practice's part has started (e.g. resume from a checkpoint)
      before_train()            a step or an end of epoch is about to change the run: raise to refuse
      before_step(batch)        each step: may replace the batch
      wrap_step(step)           around forward, backward and update (a compiled region)
      wrap_forward(forward)     around ``batch -> loss`` (precision policy inside)
      update_due(micro_batches) whether the window's micro-batches (this one included) update now
      window_divisor(micro_batches)  what the window's summed gradients are divided by (its length)
      wrap_apply(apply)         around applying the window's gradients: reduced across replicas,
                                averaged over the window, unscaled (fp16), on_gradients, optimizer.step
      on_gradients()            gradients final for this update, before the optimizer steps
      after_update()            the optimizer stepped, gradients zeroed, scheduler stepped
      after_step(batch, loss, updated)
      end_epoch()               a ``run.batches(name)`` loop ran out after training on its batches
                                (a window left open was applied first, through the same update)
      between_steps()           after a step's ``after_step`` or an ``end_epoch``, once every practice
                                has seen it: the run is whole between two steps (stop here on SIGTERM)
      outside_step()            a context for work between steps (evaluation)
      state_dict() / load_state_dict(state)   the per-run state a checkpoint carries
      state_mismatch(state)     why a checkpoint's state cannot be loaded (asked before a restore
                                changes anything)
      before_save()             a checkpoint is about to be written: refuse or settle
      checkpointing()           a context the run's state is taken (save) or put back (restore) in
      close()                   the session ends (normal exit or error)

Every update, the end of an epoch's partial window included, goes through the
same path: whether a micro-batch updates is decided by ``update_due`` alone,
and everything around an update (``wrap_apply``, ``on_gradients``,
``after_update``) runs on each one, whatever the listing.

``marks_step = True`` says the hook places the step marker itself (a device
loader that syncs before each batch, a compiled region that syncs at its end):
the step then issues none of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import attrs
import torch
from torch import nn

from xlapipe.precision import Precision

Forward = Callable[[Any], torch.Tensor]  # batch -> loss
Step = Callable[[Any], "tuple[torch.Tensor, bool]"]  # batch -> (loss, updated)
Action = Callable[[], None]
H = TypeVar("H", bound="Hook")


class SetupView(Protocol):
    """What a hook sees of the setup before it is realised (an :class:`xlapipe.TrainingSetup`)."""

    @property
    def module(self) -> nn.Module: ...

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> Precision: ...


class Context(Protocol):
    """What a hook sees of the run it takes part in (an :class:`xlapipe.Run`)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    device: torch.device
    precision: Precision
    loaders: dict[str, Any]
    values: dict[str, Any]
    hooks: tuple[Hook, ...]

    @property
    def steps(self) -> int: ...

    @property
    def updates(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def failed(self) -> bool: ...

    @property
    def marks_step_elsewhere(self) -> bool: ...

    def hook(self, kind: type[H]) -> H | None: ...


class Hook:
    """A practice's part in a session; override what it needs (see the module docstring)."""

    marks_step: bool = False

    # -- realising the setup -------------------------------------------------------------
    def before_placement(self, setup: SetupView) -> None:
        """Before the model is moved (nothing is on the device yet)."""

    def after_placement(self, model: nn.Module) -> None:
        """The moved model, before the optimizer is built on its parameters."""

    def start(self, run: Context) -> Hook:
        """This hook's part in ``run`` (a new object when it keeps per-run state)."""
        return self

    def after_start(self) -> None:
        """Every practice's per-run part has started; the session is about to hand the run over."""

    # -- the step ----------------------------------------------------------------------------
    def before_train(self) -> None:
        """A step or an end of epoch is about to change the run: raise to refuse it (nothing changed yet)."""

    def before_step(self, batch: Any) -> Any:
        return batch

    def wrap_step(self, step: Step) -> Step:
        return step

    def wrap_forward(self, forward: Forward) -> Forward:
        return forward

    def update_due(self, micro_batches: int) -> bool:
        """Whether the window of ``micro_batches`` (this one included) is applied now."""
        return True

    def window_divisor(self, micro_batches: int) -> int:
        """What the summed gradients of a window of ``micro_batches`` are divided by when it is
        applied: by default its length (their average)."""
        return micro_batches

    def wrap_apply(self, apply: Action) -> Action:
        return apply

    def on_gradients(self) -> None:
        """Gradients are final for this update (reduced, averaged, unscaled); the optimizer has not stepped."""

    def after_update(self) -> None:
        """The optimizer stepped (gradients zeroed, scheduler stepped)."""

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        """The step is done (and marked, unless a loader marks it before the next batch)."""

    def end_epoch(self) -> None:
        """A ``run.batches(name)`` loop that fed training ran out of batches."""

    def between_steps(self) -> None:
        """Every practice has seen the last step (or end of epoch): what a checkpoint takes now is whole."""

    # -- between steps -------------------------------------------------------------------
    def outside_step(self) -> contextlib.AbstractContextManager:
        """The context for work done between steps, such as evaluation."""
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, Any]:
        """This run's state of the practice that a resumed run needs (CPU tensors, plain data)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave (called before the first step of a resumed run)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, and was given {sorted(state)}")

    def state_mismatch(self, state: Mapping[str, Any]) -> str | None:
        """Why ``state`` (from a checkpoint) cannot be loaded by :meth:`load_state_dict` (None: it can).

        Asked of every practice before a restore changes anything.
        """
        return None

    def before_save(self) -> None:
        """A checkpoint of the run is about to be written: raise to refuse it."""

    def checkpointing(self) -> contextlib.AbstractContextManager:
        """The context a checkpoint takes the run's state in, or puts it back in (e.g. the model's
        own weights in place of ones lent to it for evaluation)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """The session ends; release what :meth:`start` took."""

    def describe(self) -> dict:
        """Plain data naming the hook: its attrs fields (a function by its name), when it is an attrs class."""
        fields = attrs.asdict(cast(Any, self), recurse=False) if attrs.has(type(self)) else {}
        plain = {k: getattr(v, "__qualname__", repr(v)) if callable(v) else v for k, v in fields.items()}
        return {"hook": type(self).__name__, **plain}
