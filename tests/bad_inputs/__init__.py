"""Every bad input we tried, and the error it must get.

Each case is (id, what the user did, a zero-argument callable doing it, the
exception type, a fragment of the message). ``tests/test_bad_inputs.py``
asserts them; ``tools/error_table.py`` runs them for real and writes
``docs/errors.md``. Run in a process whose XLA runtime has started on the CPU
with one device (as ``tests/conftest.py`` and the tool arrange).

To add cases: append to the list of the section they belong to (or start a
section and add it to ``CASES`` at the bottom), then run
``.venv/bin/python tools/error_table.py``."""

from __future__ import annotations

from bad_inputs.checkpoints import CHECKPOINT, CHECKPOINT_SAFETY
from bad_inputs.common import SCRATCH, Case, message_of
from bad_inputs.core import CORE, OPTIMIZER_FACTORY, PROTOCOL_AND_REAL_PATHS, STEP_FEATURES
from bad_inputs.practices import (
    COMPILE_STEP,
    HF_TRACED_MASKS,
    MATMUL_PRECISION,
    RECOMPILE_GUARD,
    SCALE_OUT,
    SCAN_LAYERS,
    STATIC_SHAPES,
    STATIC_SHAPES_LABELS,
    TORCH_XLA_PRACTICES,
)

SECTIONS: dict[str, list[Case]] = {
    "Core: setup, precision, transforms, pipeline, session, step": CORE,
    "Scale-out: shard_data, with_compile_cache": SCALE_OUT,
    "Checkpoints": CHECKPOINT,
    "static_shapes": STATIC_SHAPES,
    "compile_step": COMPILE_STEP,
    "recompile_guard": RECOMPILE_GUARD,
    "hf_traced_masks": HF_TRACED_MASKS,
    "Step features: accumulation, clipping, scheduler, logging, the loss, the run": STEP_FEATURES,
    "torch_xla's practices: compile_step backends, no_host_reads, profile": TORCH_XLA_PRACTICES,
    "Checkpoints: what cannot load back, damaged files, runs they do not fit": CHECKPOINT_SAFETY,
    "Optimizer factories": OPTIMIZER_FACTORY,
    "static_shapes: token labels": STATIC_SHAPES_LABELS,
    "scan_layers": SCAN_LAYERS,
    "with_matmul_precision": MATMUL_PRECISION,
    "The practice protocol and the paths real scripts take": PROTOCOL_AND_REAL_PATHS,
}
CASES: list[Case] = [case for cases in SECTIONS.values() for case in cases]

__all__ = ["CASES", "SCRATCH", "SECTIONS", "Case", "message_of"]
