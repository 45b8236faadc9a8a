"""accumulate_grad: one optimizer update every ``steps`` micro-batches.

Each ``run.step`` is one micro-batch: forward and backward add to the
gradients, and every ``steps``-th call runs the update (gradients reduced
across replicas, clipped if asked, the optimizer and the scheduler stepped)
with the gradients averaged over the micro-batches, as eager accumulation of
``loss / steps`` does. ``run.updates`` counts updates; the scheduler steps
once per update.

The step marker stays on every micro-batch, as torch_xla's device loader
places it and its HF examples do (a graph per micro-batch keeps the graph
and its compilation the size of one step). For one marker per update, add
``wrap_loader_mp(batches_per_execution=steps)``: the K micro-batches are then
traced into one graph.

An epoch that ends inside a window (``run.batches(name)`` ran out) applies
the micro-batches it has, averaged over their number. A session that ends
with gradients never applied warns (:class:`PendingGradientsWarning`); a
checkpoint between micro-batches is refused (the partial gradients are not
saved).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from attrs import frozen

from xlapipe.hooks import Hook, Update
from xlapipe.transform import Transform, register, unchanged

if TYPE_CHECKING:
    from xlapipe.run import Run


class PendingGradientsWarning(RuntimeWarning):
    """A session ended with accumulated gradients that no update applied."""


@frozen
class AccumulateGrad(Hook):
    """The hook: the update runs on every ``steps``-th micro-batch."""

    steps: int

    def start(self, run: Run) -> Hook:
        return _Accumulating(self.steps, run)

    def describe(self) -> dict:
        return {"hook": "accumulate_grad", "steps": self.steps}


class _Accumulating(Hook):
    def __init__(self, steps: int, run: Run) -> None:
        self.steps, self.run = steps, run
        self.pending = 0  # micro-batches whose gradients no update has applied yet
        self.update: Update | None = None

    def wrap_update(self, update: Update) -> Update:
        self.update = update

        def every_k() -> bool:
            self.pending += 1
            return self.apply() if self.pending == self.steps else False

        return every_k

    def apply(self) -> bool:
        """Average the accumulated gradients over the pending micro-batches and update."""
        assert self.update is not None and self.run.optimizer is not None
        for group in self.run.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.pending)
        self.pending = 0
        return self.update()

    def end_epoch(self) -> None:
        if self.pending and self.update is not None:
            self.apply()
            self.run.updates += 1

    def before_save(self) -> None:
        if self.pending:
            raise ValueError(
                f"checkpoint.save between micro-batches: {self.pending} of {self.steps} micro-batches "
                "have gradients no update has applied yet, and a checkpoint does not hold gradients. "
                "Save right after an update (when run.steps is a multiple of accumulate_grad's steps, "
                "or at the end of an epoch)."
            )

    def close(self) -> None:
        if self.pending and not self.run.failed:
            warnings.warn(
                f"accumulate_grad: the session ended with {self.pending} micro-batch(es) whose gradients "
                f"no update applied (one update every {self.steps}). Iterate run.batches(name), which "
                "applies them when the loader runs out, or make the number of steps a multiple of "
                f"{self.steps}.",
                PendingGradientsWarning,
                stacklevel=4,
            )


@register
def accumulate_grad(steps: int = 2) -> Transform:
    """Update the weights every ``steps`` micro-batches, with their averaged gradients."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(
            f"accumulate_grad: steps must be a positive int (micro-batches per update), got {steps!r}"
        )
    return Transform("accumulate_grad", unchanged, {"steps": steps}, hooks=(AccumulateGrad(steps),))
