"""wrap_model_mp: one host copy of the model shared by forked replicas.

The model is wrapped in torch_xla's ``MpModelWrapper`` in the parent, before
replicas are forked (see :func:`xlapipe.launch`). Each replica then moves it
to its device under the wrapper's process-shared lock, one at a time, reading
the host pages without writing them, so the pages stay shared.

Where one process drives several devices as threads (CPU with
``CPU_NUM_DEVICES>1``, TPU v2/v3), every thread would get the same module and
the weights would land on another thread's device: realising such a setup is
refused.
"""

from __future__ import annotations

from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.placement import copy_tree
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, register


def _wrap(setup: TrainingSetup) -> TrainingSetup:
    if isinstance(setup.model, MpModelWrapper):
        return setup  # never wrap twice
    # A shallow copy of the module tree: same tensors, so no host memory, and
    # the user's module object is never touched by what replicas do.
    return setup.evolve(model=MpModelWrapper(copy_tree(setup.model)))


@register
def wrap_model_mp() -> Transform:
    """Share the model's host memory across forked replicas (``MpModelWrapper``)."""
    return Transform(
        "wrap_model_mp",
        _wrap,
        needs=("with_device",),
        excludes=("shard_data",),
        reasons={
            "shard_data": "sharing the model across forked replicas has no meaning under SPMD, where one "
            "program runs over the whole mesh; remove wrap_model_mp",
        },
    )


claims.declare(
    Claim(
        "wrap_model_mp",
        wrap_model_mp,
        summary="one host copy of the weights shared by forked replicas (MpModelWrapper)",
    )
)
