"""xlapipe: PyTorch/XLA training practices as pure, composable, measurable transforms.

>>> setup = TrainingSetup(model, optimizer, loaders={"train": loader})
>>> pipeline = Pipeline(with_device(), with_precision("bf16"), wrap_loader_mp())
>>> with session(pipeline(setup)) as run:
...     for batch in run.batches("train"):
...         loss = run.step(batch, loss_fn)

``import xlapipe`` imports neither torch nor torch_xla: each name is imported
when first used, so a process that only plans and reports (the ablation's
driver) stays small. The practices register when any of them is first used.
"""

import importlib
import sys
import types
from importlib import metadata as _metadata
from typing import TYPE_CHECKING

from xlapipe import runtime

# Importing torch_xla picks a PJRT device when none is set (TPU when present,
# else CPU, with a warning). Make the same choice first, quietly.
runtime.ensure_pjrt_device()

if TYPE_CHECKING:
    from xlapipe import checkpoint, checks, effects, hooks, metrics, placement
    from xlapipe.ablation import ablate
    from xlapipe.batches import to_device
    from xlapipe.device_loader import DeviceLoader
    from xlapipe.effects import DefaultDevice, DefaultDtype, Effect, EnvVar
    from xlapipe.hooks import Hook
    from xlapipe.launch import launch
    from xlapipe.layer_scan import ScanLayersError
    from xlapipe.pipeline import Pipeline
    from xlapipe.precision import Precision
    from xlapipe.run import Run
    from xlapipe.session import realize, session
    from xlapipe.step import PendingGradientsWarning, WrapperError
    from xlapipe.training_setup import TrainingSetup
    from xlapipe.transform import OrderError, Transform, check_order, practice, rebuild, register
    from xlapipe.transforms.accumulate import accumulate_grad
    from xlapipe.transforms.clip import clip_grad_norm
    from xlapipe.transforms.compile_cache import CompileCacheWarning, with_compile_cache
    from xlapipe.transforms.compile_step import CompileStepError, CompileStepWarning, compile_step
    from xlapipe.transforms.default_dtype import set_default_tensor_type
    from xlapipe.transforms.device import with_device
    from xlapipe.transforms.ema import averaged_weights, ema, using_averaged_weights
    from xlapipe.transforms.hf_masks import hf_traced_masks
    from xlapipe.transforms.host_reads import HostReadError, no_host_reads
    from xlapipe.transforms.loader_mp import wrap_loader_mp
    from xlapipe.transforms.log_metrics import log_every
    from xlapipe.transforms.matmul_precision import MatmulPrecisionWarning, with_matmul_precision
    from xlapipe.transforms.model_mp import wrap_model_mp
    from xlapipe.transforms.precision import with_precision
    from xlapipe.transforms.preemption import Preempted, checkpoint_on_preemption
    from xlapipe.transforms.profile import ProfileWarning, profile
    from xlapipe.transforms.recompile_guard import (
        RecompileError,
        RecompileWarning,
        recompile_guard,
        unguarded,
    )
    from xlapipe.transforms.scan_layers import scan_layers
    from xlapipe.transforms.shard_data import SpmdPlan, shard_data
    from xlapipe.transforms.static_shapes import static_shapes

_ATTRIBUTES = {
    "to_device": "xlapipe.batches",
    "DefaultDevice": "xlapipe.effects",
    "DefaultDtype": "xlapipe.effects",
    "Effect": "xlapipe.effects",
    "EnvVar": "xlapipe.effects",
    "Hook": "xlapipe.hooks",
    "launch": "xlapipe.launch",
    "ScanLayersError": "xlapipe.layer_scan",
    "Pipeline": "xlapipe.pipeline",
    "Precision": "xlapipe.precision",
    "Run": "xlapipe.run",
    "realize": "xlapipe.session",
    "session": "xlapipe.session",
    "PendingGradientsWarning": "xlapipe.step",
    "WrapperError": "xlapipe.step",
    "TrainingSetup": "xlapipe.training_setup",
    "OrderError": "xlapipe.transform",
    "Transform": "xlapipe.transform",
    "check_order": "xlapipe.transform",
    "practice": "xlapipe.transform",
    "rebuild": "xlapipe.transform",
    "register": "xlapipe.transform",
    "DeviceLoader": "xlapipe.transforms",
    "Preempted": "xlapipe.transforms",
    "accumulate_grad": "xlapipe.transforms",
    "averaged_weights": "xlapipe.transforms",
    "checkpoint_on_preemption": "xlapipe.transforms",
    "clip_grad_norm": "xlapipe.transforms",
    "compile_step": "xlapipe.transforms",
    "ema": "xlapipe.transforms",
    "hf_traced_masks": "xlapipe.transforms",
    "log_every": "xlapipe.transforms",
    "no_host_reads": "xlapipe.transforms",
    "profile": "xlapipe.transforms",
    "recompile_guard": "xlapipe.transforms",
    "scan_layers": "xlapipe.transforms",
    "set_default_tensor_type": "xlapipe.transforms",
    "shard_data": "xlapipe.transforms",
    "static_shapes": "xlapipe.transforms",
    "unguarded": "xlapipe.transforms",
    "using_averaged_weights": "xlapipe.transforms",
    "with_compile_cache": "xlapipe.transforms",
    "with_device": "xlapipe.transforms",
    "with_matmul_precision": "xlapipe.transforms",
    "with_precision": "xlapipe.transforms",
    "wrap_loader_mp": "xlapipe.transforms",
    "wrap_model_mp": "xlapipe.transforms",
    "CompileCacheWarning": "xlapipe.transforms.compile_cache",
    "CompileStepError": "xlapipe.transforms.compile_step",
    "CompileStepWarning": "xlapipe.transforms.compile_step",
    "HostReadError": "xlapipe.transforms.host_reads",
    "MatmulPrecisionWarning": "xlapipe.transforms.matmul_precision",
    "ProfileWarning": "xlapipe.transforms.profile",
    "RecompileError": "xlapipe.transforms.recompile_guard",
    "RecompileWarning": "xlapipe.transforms.recompile_guard",
    "SpmdPlan": "xlapipe.transforms.shard_data",
    "ablate": "xlapipe.ablation",
}
_MODULES = ("checkpoint", "checks", "effects", "hooks", "metrics", "placement")


class _Package(types.ModuleType):
    """The package, whose functions named like their modules stay functions.

    Importing ``xlapipe.session`` (the module) sets the package's ``session``
    to it; with the names imported lazily, that would hide ``xp.session``
    (the function) from :func:`__getattr__`.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name in _ATTRIBUTES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> object:
    """Each public name, imported when first used (and kept)."""
    if name in _MODULES:
        value: object = importlib.import_module(f"xlapipe.{name}")
    elif name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    else:
        raise AttributeError(f"module 'xlapipe' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


try:
    __version__ = _metadata.version("xlapipe")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CompileCacheWarning",
    "CompileStepError",
    "CompileStepWarning",
    "DefaultDevice",
    "DefaultDtype",
    "DeviceLoader",
    "Effect",
    "EnvVar",
    "Hook",
    "HostReadError",
    "OrderError",
    "PendingGradientsWarning",
    "Preempted",
    "ProfileWarning",
    "Pipeline",
    "Precision",
    "RecompileError",
    "RecompileWarning",
    "Run",
    "SpmdPlan",
    "Transform",
    "TrainingSetup",
    "WrapperError",
    "__version__",
    "ablate",
    "accumulate_grad",
    "averaged_weights",
    "checkpoint_on_preemption",
    "check_order",
    "checkpoint",
    "checks",
    "clip_grad_norm",
    "compile_step",
    "ema",
    "effects",
    "hf_traced_masks",
    "hooks",
    "launch",
    "log_every",
    "no_host_reads",
    "profile",
    "metrics",
    "placement",
    "practice",
    "realize",
    "rebuild",
    "recompile_guard",
    "register",
    "runtime",
    "session",
    "set_default_tensor_type",
    "shard_data",
    "static_shapes",
    "to_device",
    "unguarded",
    "using_averaged_weights",
    "with_compile_cache",
    "with_device",
    "with_precision",
    "wrap_loader_mp",
    "wrap_model_mp",
    "MatmulPrecisionWarning",
    "ScanLayersError",
    "scan_layers",
    "with_matmul_precision",
]
