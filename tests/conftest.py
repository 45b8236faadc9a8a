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


# -- the long matrices: left out unless asked for ---------------------------------------------------
# A hook, not `addopts = "-m 'not corpus_full'"`: a `-m` on the command line replaces the one in
# addopts, so `pytest -m "not slow"` (docs/testing.md) would have run the whole matrix.
LONG = {
    "corpus_full": "the whole matrix of tests/test_corpus.py (make corpus)",
    "claims_full": "every claim on every zoo case, law and save point (tests/test_claims.py; make fuzz)",
    "long": "the end-to-end checks too long for CI's slice (make long)",
}


def pytest_addoption(parser):
    for marker, what in LONG.items():
        parser.addoption(f"--{marker.replace('_', '-')}", action="store_true", help=f"also run {what}")


def pytest_collection_modifyitems(config, items):
    chosen = config.getoption("markexpr") or ""
    wanted = {m for m in LONG if config.getoption(m) or m in chosen}
    left_out = [i for i in items if any(i.get_closest_marker(m) for m in LONG if m not in wanted)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = {id(i) for i in left_out}
        items[:] = [i for i in items if id(i) not in dropped]
