"""Real torch_xla on the CPU runtime (or a TPU when present); no mocks."""

import os
import sys

import pytest

from xlapipe import runtime

runtime.ensure_pjrt_device()
os.environ.setdefault("CPU_NUM_DEVICES", "1")

# Start the XLA runtime before any CPU backward pass: PyTorch's autograd engine
# sizes its device queues on first use and would have none for XLA otherwise.
import torch_xla  # noqa: E402

torch_xla.device()

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def tiny():
    """A factory of tiny classification workloads, deterministic by seed."""
    from helpers import tiny_setup

    return tiny_setup
