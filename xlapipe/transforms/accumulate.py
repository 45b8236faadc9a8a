"""accumulate_grad: one optimizer update every ``steps`` micro-batches.

Each ``run.step`` is one micro-batch: forward and backward add to the
gradients, and every ``steps``-th call runs the update (gradients reduced
across replicas, averaged over the micro-batches as eager accumulation of
``loss / steps`` does, clipped if asked, the optimizer and the scheduler
stepped). ``run.updates`` counts updates, ``run.updated`` says whether the
last micro-batch updated (or, after ``run.end_epoch()``, whether that end of
epoch applied a partial window); the scheduler steps once per update.

The practice only decides *whether* a micro-batch updates (``update_due``):
the window of pending micro-batches belongs to the step, so every practice
that acts around an update (clipping, an average of weights, logging, a
compiled update) runs on each one, the end of an epoch's partial window
included, whatever the listing. An epoch that ends inside a window
(``run.batches(name)`` ran out, or ``run.end_epoch()``) applies the
micro-batches it has: with ``last_window="average"`` (the default) averaged
over their number m, with ``last_window="divide_by_steps"`` their sum divided
by ``steps``, as Hugging Face Accelerate and a hand-written ``loss / steps``
loop do (the short window then weighs m/steps of a full one). Full windows are
the same under both. A checkpoint between
micro-batches saves the window (its gradients and count) and resumes it
exactly. A step that fails (its loss function raised) leaves the window as it
was before it. A session that ends with gradients never applied warns
(:class:`xlapipe.PendingGradientsWarning`).

The step marker stays on every micro-batch, as torch_xla's device loader
places it and its HF examples do (a graph per micro-batch keeps the graph and
its compilation the size of one step). For one marker per update, add
``wrap_loader_mp(batches_per_execution=steps)``: the K micro-batches are then
traced into one graph.
"""

from __future__ import annotations

from attrs import field, frozen

from xlapipe import checks, claims
from xlapipe.claims import Claim
from xlapipe.hooks import Hook
from xlapipe.transform import Transform, practice, register

LAST_WINDOWS = ("average", "divide_by_steps")


@frozen
class AccumulateGrad(Hook):
    """The practice's parameters and its hook: the window is applied every ``steps`` micro-batches."""

    steps: int = field(
        validator=checks.positive_int("accumulate_grad", "steps", " (micro-batches per update)")
    )
    last_window: str = field(
        default="average",
        validator=checks.one_of(
            "accumulate_grad",
            "last_window",
            LAST_WINDOWS,
            " (how an epoch's short last window is divided: by its own length, or by steps as "
            "Accelerate does)",
        ),
    )

    def update_due(self, micro_batches: int) -> bool:
        return micro_batches >= self.steps

    def window_divisor(self, micro_batches: int) -> int:
        return self.steps if self.last_window == "divide_by_steps" else micro_batches


@register
def accumulate_grad(steps: int = 2, last_window: str = "average") -> Transform:
    """Update the weights every ``steps`` micro-batches, with their averaged gradients.

    ``last_window``: an epoch's short last window of m < ``steps`` micro-batches
    is averaged over m (``"average"``) or summed and divided by ``steps``
    (``"divide_by_steps"``: Accelerate's ``accumulate`` and the ``loss / steps`` loop).
    """
    return practice("accumulate_grad", AccumulateGrad(steps, last_window))


claims.declare(
    Claim(
        "accumulate_grad",
        lambda: accumulate_grad(3),
        summary="an update every k micro-batches, their gradients averaged",
        reference=lambda t: claims.Reference(
            window=dict(t.params)["steps"], last_window=dict(t.params)["last_window"]
        ),
    )
)
