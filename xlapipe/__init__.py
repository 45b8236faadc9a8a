"""xlapipe: PyTorch/XLA training practices as pure, composable, measurable transforms.

>>> setup = TrainingSetup(model, optimizer, loaders={"train": loader})
>>> pipeline = Pipeline(with_device(), with_precision("bf16"), wrap_loader_mp())
>>> with session(pipeline(setup)) as run:
...     for batch in run.batches("train"):
...         loss = run.step(batch, loss_fn)
"""

from importlib import metadata as _metadata

from xlapipe import runtime

# Importing torch_xla picks a PJRT device when none is set (TPU when present,
# else CPU, with a warning). Make the same choice first, quietly.
runtime.ensure_pjrt_device()

from xlapipe import checkpoint, checks, effects, hooks, metrics, placement  # noqa: E402
from xlapipe.batches import to_device
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
from xlapipe.transforms import (
    DeviceLoader,
    Preempted,
    accumulate_grad,
    averaged_weights,
    checkpoint_on_preemption,
    clip_grad_norm,
    compile_step,
    ema,
    hf_traced_masks,
    log_every,
    no_host_reads,
    profile,
    recompile_guard,
    scan_layers,
    set_default_tensor_type,
    shard_data,
    static_shapes,
    unguarded,
    using_averaged_weights,
    with_compile_cache,
    with_device,
    with_matmul_precision,
    with_precision,
    wrap_loader_mp,
    wrap_model_mp,
)
from xlapipe.transforms.compile_cache import CompileCacheWarning
from xlapipe.transforms.compile_step import CompileStepError, CompileStepWarning
from xlapipe.transforms.host_reads import HostReadError
from xlapipe.transforms.matmul_precision import MatmulPrecisionWarning
from xlapipe.transforms.profile import ProfileWarning
from xlapipe.transforms.recompile_guard import RecompileError, RecompileWarning
from xlapipe.transforms.shard_data import SpmdPlan


def __getattr__(name: str) -> object:
    """``xlapipe.ablate``, imported when first used: ``import xlapipe`` loads no ablation module."""
    if name == "ablate":
        from xlapipe.ablation import ablate

        return ablate
    raise AttributeError(f"module 'xlapipe' has no attribute {name!r}")


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
