"""with_device: train on the XLA device, with the optimizer following the weights.

The move itself happens when the setup is realised (:func:`xlapipe.session`):
a copy of the model goes to ``torch_xla.device()`` with shared weights kept
shared, and the optimizer is rebound to the moved parameters with its state.
While the session lasts, batch norm's running variance is updated as in
PyTorch (:class:`xlapipe.kernel_fixes.CorrectBatchNorm`), elu's gradient is
PyTorch's (:class:`~xlapipe.kernel_fixes.CorrectEluGradient`), and so are
``torch.norm`` with p = inf (:class:`~xlapipe.kernel_fixes.CorrectNorm`),
``x.amax()`` with no dimension (:class:`~xlapipe.kernel_fixes.CorrectExtrema`),
reductions given an empty dimension list
(:class:`~xlapipe.kernel_fixes.CorrectEmptyDims`), ``torch.diagonal`` over
dims 0 and 1 of a 3-D or larger tensor (:class:`~xlapipe.kernel_fixes.CorrectDiagonal`)
, ``F.interpolate`` by a scale or, off the TPU, bilinear
(:class:`~xlapipe.kernel_fixes.CorrectInterpolate`) and the SVD of a batch
(:class:`~xlapipe.kernel_fixes.CorrectBatchedSvd`).
"""

from __future__ import annotations

from xlapipe import claims
from xlapipe.claims import Claim, Refusal
from xlapipe.kernel_fixes import (
    CorrectBatchedSvd,
    CorrectBatchNorm,
    CorrectDiagonal,
    CorrectEluGradient,
    CorrectEmptyDims,
    CorrectExtrema,
    CorrectInterpolate,
    CorrectNorm,
)
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, register


def _to_xla(setup: TrainingSetup) -> TrainingSetup:
    return setup.evolve(device="xla")


# torch_xla 2.9 kernels that compute wrong numbers without a word, corrected while the session lasts
KERNEL_FIXES = (
    CorrectBatchNorm(),
    CorrectEluGradient(),
    CorrectNorm(),
    CorrectExtrema(),
    CorrectEmptyDims(),
    CorrectDiagonal(),
    CorrectInterpolate(),
    CorrectBatchedSvd(),
)


@register
def with_device() -> Transform:
    """Place the model, optimizer state and batches on this replica's XLA device."""
    return Transform("with_device", _to_xla, effects=KERNEL_FIXES)


claims.declare(
    Claim(
        "with_device",
        with_device,
        summary="the model, optimizer and batches on this replica's XLA device",
        refuses=[
            Refusal("iterable", "position inside an epoch xlapipe cannot know", when="save"),
        ],
    )
)
