"""hf_traced_masks: keep transformers from reading attention masks on the host.

On every forward, transformers (``masking_utils``) asks whether the attention
mask pads anything (``padding_mask.all()``) so that it can drop an all-ones
mask and pick a faster kernel. On a lazy XLA tensor that question is a host
read: it cuts the step's graph in two and makes the host wait for the first
half to run (measured on the NLP example's BERT small: two XLA executions per
step instead of one; with batch lengths that vary, two compilations per new
length instead of one). transformers skips the question while a graph is
being traced (dynamo, jit, fx), which is what lazy XLA tensors are as well;
this transform tells it so. For the session,
``transformers.masking_utils.is_tracing`` also answers True for XLA tensors,
and every mask is built on the device. The results do not change: a mask with
nothing to hide adds nothing to the attention scores.

It applies to models built from transformers' ``PreTrainedModel`` and needs
``with_device`` (on the CPU the check is cheap and picks faster kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from attrs import frozen

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, register


def _masking_utils() -> ModuleType:
    """transformers' ``masking_utils``, or a clear refusal."""
    try:
        import transformers
        from transformers import masking_utils
    except ImportError as error:
        raise ImportError(
            "hf_traced_masks changes how transformers builds attention masks, and "
            f"transformers cannot be imported ({error}). Install it (pip install "
            "transformers) or drop hf_traced_masks from the pipeline."
        ) from error
    if not callable(getattr(masking_utils, "is_tracing", None)):
        raise RuntimeError(
            f"hf_traced_masks: transformers {transformers.__version__} has no "
            "masking_utils.is_tracing, which this transform relies on (transformers 5 has "
            "it). Upgrade transformers or drop hf_traced_masks from the pipeline."
        )
    return masking_utils


@frozen
class TracedMasks:
    """The effect: ``masking_utils.is_tracing`` is also True for XLA tensors."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        module: Any = _masking_utils()  # a module whose attribute is patched, then put back
        original = module.is_tracing

        def is_tracing(tensor: object = None) -> bool:
            on_xla = isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"
            return on_xla or original(tensor)

        is_tracing.xlapipe_traced_masks = True  # type: ignore[attr-defined]  # see masks_traced()
        module.is_tracing = is_tracing

        def restore() -> None:
            module.is_tracing = original

        return restore

    def describe(self) -> dict:
        return {"effect": "hf_traced_masks"}


def masks_traced() -> bool:
    """Whether hf_traced_masks is in effect now (transformers' mask check reads nothing on the host)."""
    import sys

    masking_utils = sys.modules.get("transformers.masking_utils")
    return bool(getattr(getattr(masking_utils, "is_tracing", None), "xlapipe_traced_masks", False))


def holds_transformers_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is, or holds, a transformers ``PreTrainedModel`` (transformers not imported
    here: a model built from it has imported it)."""
    import sys

    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    return any(isinstance(m, transformers.PreTrainedModel) for m in model.modules())


def _check_model(setup: TrainingSetup) -> TrainingSetup:
    _masking_utils()
    model = setup.module
    if not holds_transformers_model(model):
        raise TypeError(
            "hf_traced_masks applies to transformers models (a PreTrainedModel, or a module "
            f"holding one); the setup's model is a {type(model).__name__} with none inside. "
            "Drop hf_traced_masks from this pipeline."
        )
    return setup


@register
def hf_traced_masks() -> Transform:
    """Build transformers' attention masks on the device; never read them on the host."""
    return Transform("hf_traced_masks", _check_model, needs=("with_device",), effects=(TracedMasks(),))


claims.declare(
    Claim(
        "hf_traced_masks",
        hf_traced_masks,
        summary="Hugging Face attention masks built without a host read",
        refuses=[claims.Refusal("!hf_model", "applies to transformers models", when="build")],
    )
)
