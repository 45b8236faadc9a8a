"""with_matmul_precision: what the CPU runtime does with the level, the effect, its refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch_xla
import torch_xla.backends as backends

import xlapipe as xp
from helpers import loss_fn, tiny_setup
from xlapipe.transforms.matmul_precision import LEVELS, MatmulPrecisionWarning, _quiet, switch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _at(level: str, fn):
    before = backends.get_mat_mul_precision()
    with _quiet():
        backends.set_mat_mul_precision(level)
    try:
        return fn()
    finally:
        with _quiet():
            backends.set_mat_mul_precision(before)


def test_the_cpu_runtime_ignores_the_level():
    """The evidence for warning instead of setting it: same bits under every level, fp32 accuracy."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(192, 256, generator=g), torch.randn(256, 160, generator=g)
    x, y = a.to(torch_xla.device()), b.to(torch_xla.device())
    # A graph of its own per level (torch_xla would otherwise reuse the first one's executable).
    graphs = {
        "default": lambda: (x * 1.0) @ y,
        "high": lambda: (x + 0.0) @ y,
        "highest": lambda: (x - 0.0) @ y,
    }
    hlo, out = {}, {}
    for level in LEVELS:

        def run(level=level):
            z = graphs[level]()
            hlo[level] = torch_xla._XLAC._get_xla_tensors_hlo([z])
            return z.cpu()

        out[level] = _at(level, run)
    assert "operand_precision={highest,highest}" in hlo["highest"]  # the level reaches the graph...
    assert "operand_precision={high,high}" in hlo["high"]
    assert torch.equal(out["default"], out["highest"]) and torch.equal(
        out["high"], out["highest"]
    )  # ...and no further
    exact = a.double() @ b.double()
    one_bf16_pass = a.bfloat16().float() @ b.bfloat16().float()
    assert (out["default"].double() - exact).abs().max() < 1e-3  # fp32 arithmetic under "default"
    assert (one_bf16_pass.double() - exact).abs().max() > 1e-2  # what one bf16 pass would give


def test_a_session_on_the_cpu_runtime_warns_and_leaves_the_level_alone():
    before = backends.get_mat_mul_precision()
    other = next(level for level in LEVELS if level != before)
    setup = xp.Pipeline(xp.with_device(), xp.with_matmul_precision(other))(tiny_setup())
    with pytest.warns(MatmulPrecisionWarning, match="the CPU runtime computes fp32 matmuls in fp32"):
        with xp.session(setup) as run:
            assert backends.get_mat_mul_precision() == before
            assert torch.isfinite(run.step(next(iter(run.loaders["train"])), loss_fn))
    assert backends.get_mat_mul_precision() == before


def test_switching_after_a_compile_is_refused():
    current = backends.get_mat_mul_precision()
    assert torch_xla._XLAC._xla_get_num_cached_compilation_graph() > 0  # this process has compiled
    other = next(level for level in LEVELS if level != current)
    with pytest.raises(
        RuntimeError, match="has already compiled .* graph cache does not tell precisions apart"
    ):
        switch(other)
    assert backends.get_mat_mul_precision() == current
    switch(current)()  # the level it already has: nothing to do, nothing refused


def test_a_session_sets_the_level_and_restores_it_on_error_before_the_first_compile():
    """The TPU path, run for real on the CPU runtime (where it changes no result) in a fresh process."""
    code = (
        "import torch, torch_xla.backends as b\n"
        "import xlapipe as xp\n"
        "from xlapipe.transforms import matmul_precision\n"
        "matmul_precision.UNSUPPORTED = ()  # take the path of a runtime that honours the level\n"
        "before = b.get_mat_mul_precision()\n"
        "setup = xp.Pipeline(xp.with_device(), xp.with_matmul_precision('high'))(xp.TrainingSetup(torch.nn.Linear(4, 4)))\n"
        "try:\n"
        "    with xp.session(setup) as run:\n"
        "        during = b.get_mat_mul_precision()\n"
        "        run.model(torch.ones(2, 4, device=run.device)).cpu()\n"
        "        raise KeyError('user code failed')\n"
        "except KeyError:\n"
        "    pass\n"
        "print(before, during, b.get_mat_mul_precision())\n"
    )
    env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["default", "high", "default"]


def test_description_round_trips():
    pipeline = xp.Pipeline(xp.with_device(), xp.with_matmul_precision("high"))
    assert xp.Pipeline.from_description(pipeline.describe()) == pipeline
    assert xp.with_matmul_precision() == xp.with_matmul_precision("highest")
