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


# -- the corpus's full matrix: left out unless asked for ----------------------------------------
# A hook, not `addopts = "-m 'not corpus_full'"`: a `-m` on the command line replaces the one in
# addopts, so `pytest -m "not slow"` (docs/testing.md) would have run the whole matrix.


def pytest_addoption(parser):
    parser.addoption(
        "--corpus-full",
        action="store_true",
        help="also run the tests marked corpus_full (the whole matrix of tests/test_corpus.py; make corpus)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--corpus-full") or "corpus_full" in (config.getoption("markexpr") or ""):
        return  # asked for, or chosen by a -m of the user's own
    left_out = [item for item in items if item.get_closest_marker("corpus_full")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("corpus_full")]
