"""What the XLA runtime is, asked without starting it where possible."""
from __future__ import annotations

import glob
import importlib.util
import os

import torch


def tpu_present() -> bool:
    """True when this host has TPU chips and libtpu to drive them."""
    chips = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    return bool(chips) and importlib.util.find_spec("libtpu") is not None


def default_pjrt_device() -> str:
    """The PJRT device to use when the user chose none: TPU if present, else CPU."""
    return "TPU" if tpu_present() else "CPU"


def ensure_pjrt_device() -> str:
    """Set ``PJRT_DEVICE`` when unset and return it.

    torch_xla's own import would set it too (TPU when present, else CPU, with
    a warning); ``import xlapipe`` calls this first so the choice is quiet.
    A value the user set is never changed.
    """
    os.environ.setdefault("PJRT_DEVICE", default_pjrt_device())
    return os.environ["PJRT_DEVICE"]


def started() -> bool:
    """True once torch_xla's runtime has been initialised in this process."""
    import torch_xla

    return bool(torch_xla._XLAC._xla_runtime_is_initialized())


def device() -> torch.device:
    """This replica's XLA device (starts the runtime)."""
    import torch_xla

    return torch_xla.device()


def devices_per_process() -> int:
    """How many XLA devices this process drives (starts the runtime)."""
    import torch_xla.runtime as xr

    return int(xr.addressable_runtime_device_count())


def world_size() -> int:
    """Number of replicas taking part in training (starts the runtime)."""
    import torch_xla.runtime as xr

    return int(xr.world_size())
