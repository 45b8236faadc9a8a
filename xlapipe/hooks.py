"""The one protocol through which a practice takes part in realising a setup and in the step.

A transform records :class:`Hook` values on the setup, the way it records
process-wide effects. :func:`xlapipe.session` calls them at fixed points, in
pipeline order; what comes *after* something (``after_step``, ``close``) runs
in reverse order, and the ``wrap_*`` hooks nest, the first transform's wrapper
outermost. Every method does nothing by default: a practice overrides the few
it needs. Per-run state belongs to the object :meth:`Hook.start` returns.

The points, in the order a run meets them::

    before_placement(setup)     the model is still on the host (e.g. turn SPMD on)
    after_placement(model)      the model is on its device, the optimizer not built yet
    start(run) -> Hook          the run exists: return the hook's per-run part (self if stateless)
      before_step(batch)        each step: may replace the batch
      wrap_step(step)           around forward, backward and update (a compiled region)
      wrap_forward(forward)     around ``batch -> loss`` (precision policy inside)
      wrap_update(update)       around the whole update: may skip it (accumulation)
      on_gradients()            gradients reduced across replicas and unscaled, before the update
      wrap_optimizer_step(fn)   around ``optimizer.step()``
      after_step(batch, loss, updated)
      end_epoch()               a ``run.batches(name)`` loop ran out after training on its batches
      outside_step()            a context for work between steps (evaluation)
      before_save()             a checkpoint is about to be written: refuse or settle
      close()                   the session ends (normal exit or error)

``marks_step = True`` says the hook places the step marker itself (a device
loader that syncs before each batch, a compiled region that syncs at its end):
the step then issues none of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from xlapipe.run import Run
    from xlapipe.training_setup import TrainingSetup

Forward = Callable[[Any], torch.Tensor]  # batch -> loss
Step = Callable[[Any], "tuple[torch.Tensor, bool]"]  # batch -> (loss, updated)
Update = Callable[[], bool]  # -> whether the optimizer stepped
Action = Callable[[], None]


class Hook:
    """A practice's part in a session; override what it needs (see the module docstring)."""

    marks_step: bool = False

    # -- realising the setup -------------------------------------------------------------
    def before_placement(self, setup: TrainingSetup) -> None:
        """Before the model is moved (nothing is on the device yet)."""

    def after_placement(self, model: nn.Module) -> None:
        """The moved model, before the optimizer is built on its parameters."""

    def start(self, run: Run) -> Hook:
        """This hook's part in ``run`` (a new object when it keeps per-run state)."""
        return self

    # -- the step ----------------------------------------------------------------------------
    def before_step(self, batch: Any) -> Any:
        return batch

    def wrap_step(self, step: Step) -> Step:
        return step

    def wrap_forward(self, forward: Forward) -> Forward:
        return forward

    def wrap_update(self, update: Update) -> Update:
        return update

    def on_gradients(self) -> None:
        """Gradients are final for this update (reduced, unscaled); the optimizer has not stepped."""

    def wrap_optimizer_step(self, step: Action) -> Action:
        return step

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        """The step is done (and marked, unless a loader marks it before the next batch)."""

    def end_epoch(self) -> None:
        """A ``run.batches(name)`` loop that fed training ran out of batches."""

    # -- between steps -------------------------------------------------------------------
    def outside_step(self) -> contextlib.AbstractContextManager:
        """The context for work done between steps, such as evaluation."""
        return contextlib.nullcontext()

    def before_save(self) -> None:
        """A checkpoint of the run is about to be written: raise to refuse it."""

    def close(self) -> None:
        """The session ends; release what :meth:`start` took."""

    def describe(self) -> dict:
        """Plain data naming the hook (for ``TrainingSetup.summary``)."""
        return {"hook": type(self).__name__}
