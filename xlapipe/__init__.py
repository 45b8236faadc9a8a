"""xlapipe: PyTorch/XLA training practices as pure, composable, measurable transforms.

>>> setup = TrainingSetup(model, optimizer, loaders={"train": loader})
>>> pipeline = Pipeline(with_device(), with_precision("bf16"), wrap_loader_mp())
>>> with session(pipeline(setup)) as run:
...     for batch in run.loaders["train"]:
...         loss = run.step(batch, loss_fn)
"""
from xlapipe import runtime

# Importing torch_xla picks a PJRT device when none is set (TPU when present,
# else CPU, with a warning). Make the same choice first, quietly.
runtime.ensure_pjrt_device()

from xlapipe import effects, metrics, placement  # noqa: E402
from xlapipe.effects import DefaultDevice, DefaultDtype, EnvVar
from xlapipe.pipeline import Pipeline
from xlapipe.precision import Precision
from xlapipe.session import Run, realize, session
from xlapipe.step import to_device, train_step
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import OrderError, Transform, check_order, rebuild, register
from xlapipe.transforms import (
    DeviceLoader,
    set_default_tensor_type,
    with_device,
    with_precision,
    wrap_loader_mp,
    wrap_model_mp,
)

__all__ = [
    "DefaultDevice", "DefaultDtype", "DeviceLoader", "EnvVar", "OrderError", "Pipeline",
    "Precision", "Run", "Transform", "TrainingSetup", "check_order", "realize", "rebuild",
    "register", "session", "set_default_tensor_type", "to_device", "train_step",
    "with_device", "with_precision", "wrap_loader_mp", "wrap_model_mp",
    "effects", "metrics", "placement", "runtime",
]
