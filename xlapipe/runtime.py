"""What the XLA runtime is, asked without starting it where possible."""

from __future__ import annotations

import gc
import glob
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _freeze_inherited_objects() -> None:
    """In a forked child (a DataLoader worker), never collect what the parent left behind.

    The parent's unreachable XLA tensors come along in the fork. Were the
    child's garbage collector to free them, their destructor would take a
    torch_xla lock that another parent thread may have held at the fork, and
    the worker would hang for ever (seen in a DataLoader worker with
    ``num_workers=2``). ``gc.freeze()`` leaves them alone; objects the child
    makes itself are collected as usual.
    """
    if "torch_xla" in sys.modules:
        gc.freeze()


os.register_at_fork(after_in_child=_freeze_inherited_objects)


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


def kind() -> str:
    """The runtime's device type, upper-cased ("CPU", "TPU", ...): the one running, else the default."""
    import torch_xla.runtime as xr

    return (xr.device_type() or default_pjrt_device()).upper()


def started() -> bool:
    """True once torch_xla's runtime has been initialised in this process."""
    import torch_xla

    return bool(torch_xla._XLAC._xla_runtime_is_initialized())


# Read by torch_xla once, when its runtime starts, and kept for the life of the process:
# they change the numbers every later graph computes.
NUMERIC_STARTUP_VARS = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")
_started_with: dict[str, str | None] | None = None


def device() -> torch.device:
    """This replica's XLA device (starts the runtime, noting the start-up variables it reads)."""
    import torch_xla

    global _started_with
    if _started_with is None:
        # The runtime reads them now, or read them when it started before xlapipe looked.
        _started_with = {name: os.environ.get(name) for name in NUMERIC_STARTUP_VARS}
    return torch_xla.device()


def started_with() -> dict[str, str | None]:
    """The numeric start-up variables this process's runtime runs with ({} before it starts)."""
    return dict(_started_with or {})


def check_startup_env(requested: dict[str, str]) -> None:
    """Refuse a session whose effects contradict a start-up variable the runtime already runs with.

    ``requested``: the values the session's own effects set. A variable set
    when the runtime started (an earlier session's ``with_precision("bf16",
    mode="env")``) stays in force for the whole process, though the session
    that set it restored the environment: a later fp32 session would silently
    compute in bf16.
    """
    for name, value in started_with().items():
        active = value not in (None, "", "0")
        if active and requested.get(name) != value:
            raise RuntimeError(
                f"this process's XLA runtime started with {name}={value} (an earlier session's "
                f"with_precision('bf16', mode='env'), or the environment), and torch_xla keeps it for "
                "the life of the process: this session would compute in bf16 though its pipeline "
                f"does not ask for it. Run it in a fresh process (xlapipe ablate runs every variant in "
                f"its own), or give it the same with_precision('bf16', mode='env')."
            )


def devices_per_process() -> int:
    """How many XLA devices this process drives (starts the runtime)."""
    import torch_xla.runtime as xr

    return int(xr.addressable_runtime_device_count())


def world_size() -> int:
    """Number of replicas taking part in training (starts the runtime)."""
    import torch_xla.runtime as xr

    return int(xr.world_size())
