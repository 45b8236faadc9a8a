"""scan_layers: same losses as the unrolled stack, a smaller graph, the user's model untouched.

The refusals are in bad_inputs/ (run by test_bad_inputs.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch_xla
from torch import nn
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

import xlapipe as xp
from scan_models import (
    Stack,
    bert_loss,
    dense_batches,
    dense_loss,
    gpt2_loss,
    sequential,
    text_batches,
    tiny_bert,
    tiny_gpt2,
)
from xlapipe.layer_scan import ScannedLayers


def losses(model: nn.Module, batches: list, loss_fn, scan: tuple | None, *extra: xp.Transform) -> list[float]:
    """Train a few steps with AdamW through a session; ``scan`` is scan_layers' ``layers`` (or no scan)."""
    transforms = [xp.with_device()] + ([xp.scan_layers(*scan)] if scan is not None else []) + list(extra)
    setup = xp.TrainingSetup(model, lambda p: torch.optim.AdamW(p, lr=1e-2), {"train": batches})
    with xp.session(xp.Pipeline(*transforms)(setup)) as run:
        return [float(run.step(batch, loss_fn)) for batch in run.loaders["train"]]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b))


def test_bert_losses_match_the_unrolled_model():
    batches = text_batches()
    unrolled = losses(tiny_bert(), batches, bert_loss, None, xp.hf_traced_masks())
    scanned = losses(tiny_bert(), batches, bert_loss, (), xp.hf_traced_masks())
    assert close(scanned, unrolled), (scanned, unrolled)
    assert unrolled[0] != unrolled[-1]  # it trained


@pytest.mark.long  # BERT's stack (in CI) is the same scan over a transformers model
def test_gpt2_losses_match_the_unrolled_model():
    batches = text_batches()
    unrolled = losses(tiny_gpt2(), batches, gpt2_loss, None)
    scanned = losses(tiny_gpt2(), batches, gpt2_loss, ())
    assert close(scanned, unrolled), (scanned, unrolled)


def test_user_module_list_losses_match_the_unrolled_model():
    batches = dense_batches(6)
    unrolled = losses(Stack(), batches, dense_loss, None)
    scanned = losses(Stack(), batches, dense_loss, ("blocks",))
    assert close(scanned, unrolled), (scanned, unrolled)
    assert unrolled[0] > unrolled[-1]


def test_user_sequential_losses_match_the_unrolled_model():
    batches = dense_batches()
    assert close(
        losses(sequential(), batches, dense_loss, ("1",)), losses(sequential(), batches, dense_loss, None)
    )


def test_it_runs_with_wrap_model_mp_before_or_after_it():
    batches = dense_batches(2)
    reference = losses(Stack(), batches, dense_loss, None)
    for order in (
        (xp.wrap_model_mp(), xp.scan_layers("blocks")),
        (xp.scan_layers("blocks"), xp.wrap_model_mp()),
    ):
        setup = xp.Pipeline(xp.with_device(), *order)(
            xp.TrainingSetup(Stack(), lambda p: torch.optim.AdamW(p, lr=1e-2), {"train": batches})
        )
        assert isinstance(setup.model, MpModelWrapper)
        assert isinstance(setup.module.blocks, ScannedLayers)
        with xp.session(setup) as run:
            assert close([float(run.step(b, dense_loss)) for b in batches], reference)


def test_the_users_model_is_untouched_and_names_are_kept():
    model = Stack()
    before = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    setup = xp.Pipeline(xp.with_device(), xp.scan_layers("blocks"))(xp.TrainingSetup(model))
    assert type(model.blocks) is nn.ModuleList
    assert isinstance(setup.model.blocks, nn.ModuleList) and isinstance(setup.model.blocks, ScannedLayers)
    after = setup.model.state_dict(keep_vars=True)
    assert list(after) == list(before)
    assert all(after[k] is before[k] for k in before)  # the very same tensors: nothing copied
    assert "ScannedModuleList" in repr(setup.model) and "(3): Block" in repr(setup.model)


def test_default_finds_bert_and_gpt2_stacks():
    bert = xp.Pipeline(xp.with_device(), xp.scan_layers())(xp.TrainingSetup(tiny_bert()))
    gpt2 = xp.Pipeline(xp.with_device(), xp.scan_layers())(xp.TrainingSetup(tiny_gpt2()))
    assert isinstance(bert.model.bert.encoder.layer, ScannedLayers)
    assert isinstance(gpt2.model.transformer.h, ScannedLayers)
    assert [type(m) for m in gpt2.model.modules() if isinstance(m, ScannedLayers)] != []


def test_description_round_trips():
    pipeline = xp.Pipeline(xp.with_device(), xp.scan_layers(("a.b", "c")))
    assert xp.Pipeline.from_description(pipeline.describe()) == pipeline
    assert xp.scan_layers("blocks") == xp.rebuild("scan_layers", {"layers": ["blocks"]})


def _hlo_instructions(model: nn.Module, scan: bool) -> int:
    """Instructions in the HLO of forward + backward (the gradients), traced but not compiled."""
    setup = xp.Pipeline(xp.with_device(), *([xp.scan_layers("blocks")] if scan else []))(
        xp.TrainingSetup(model)
    )
    x, y = dense_batches(1)[0]
    with xp.session(setup) as run:
        dense_loss(run.model, (x.to(run.device), y.to(run.device))).backward()
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([p.grad for p in run.model.parameters()])
        torch_xla.sync()
    return sum(" = " in line for line in hlo.splitlines())


def test_the_graph_holds_one_layer_not_one_per_layer():
    unrolled = {n: _hlo_instructions(Stack(depth=n), scan=False) for n in (2, 8)}
    scanned = {n: _hlo_instructions(Stack(depth=n), scan=True) for n in (2, 8)}
    assert scanned[8] < unrolled[8]
    # Six more layers add a few stacking ops per parameter to the scanned graph, a whole layer each unrolled.
    assert scanned[8] - scanned[2] < 0.25 * (unrolled[8] - unrolled[2]), (scanned, unrolled)


def test_evaluation_without_gradients_matches():
    x = dense_batches(1)[0][0]
    outputs = []
    for scan in (False, True):
        setup = xp.Pipeline(xp.with_device(), *([xp.scan_layers("blocks")] if scan else []))(
            xp.TrainingSetup(Stack(dropout=0.5))
        )
        with xp.session(setup) as run, torch.no_grad():
            run.model.eval()
            outputs.append(run.model(x.to(run.device)).cpu())
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)


def test_dropout_is_scaled_right_and_differs_per_layer():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.25)

        def forward(self, x):
            return self.drop(x)

    model = nn.Sequential(nn.Sequential(Drop(), Drop()))
    setup = xp.Pipeline(xp.with_device(), xp.scan_layers("0"))(xp.TrainingSetup(model))
    with xp.session(setup) as run:
        out = run.model(torch.ones(512, 16, device=run.device)).cpu()
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75**2))  # not 1/p: torch_xla's kernel fixed
    # Two independent masks keep 0.75**2 of the values; one mask reused would keep 0.75.
    assert abs((out != 0).float().mean().item() - 0.75**2) < 0.03


def test_bf16_autocast_trains_close_to_the_unrolled_model():
    batches = dense_batches(3)
    unrolled = losses(Stack(), batches, dense_loss, None, xp.with_precision("bf16"))
    scanned = losses(Stack(), batches, dense_loss, ("blocks",), xp.with_precision("bf16"))
    assert all(abs(a - b) < 2e-2 for a, b in zip(scanned, unrolled)), (scanned, unrolled)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_switching_modes_retraces_the_layer(mode):
    """A scanned stack traced in one mode must not run the other mode's trace."""
    setup = xp.Pipeline(xp.with_device(), xp.scan_layers("blocks"))(xp.TrainingSetup(Stack(dropout=0.5)))
    x = dense_batches(1)[0][0]
    with xp.session(setup) as run, torch.no_grad():
        run.model.train(mode == "train")
        run.model(x.to(run.device)).cpu()
        run.model.train(mode != "train")
        second = run.model(x.to(run.device)).cpu()
        again = run.model(x.to(run.device)).cpu()
    # In eval mode dropout is off: two passes agree; in train mode they differ.
    assert torch.equal(second, again) == (mode == "train")


def test_no_tensor_of_a_pass_outlives_it():
    """A lazy tensor alive at the step marker becomes a graph output; kept alive by chance (a reference
    cycle waiting for the garbage collector), it changes the graph and costs a compilation."""
    import gc

    from xlapipe.layer_scan import _Chain
    from xlapipe.transforms.compile_step import native_dropout_is_correct

    native_dropout_is_correct()  # scan_layers' dropout probe compiles two tiny graphs once per process
    batches = dense_batches(4)
    counts = []
    earlier = [o for o in gc.get_objects() if type(o) is _Chain]  # other tests' passes (held: no id reuse)
    gc.disable()
    try:
        for scan in (None, ("blocks",)):
            before = torch_xla._XLAC._xla_get_num_cached_compilation_graph()
            losses(Stack(), batches, dense_loss, scan)
            counts.append(torch_xla._XLAC._xla_get_num_cached_compilation_graph() - before)
            assert not [o for o in gc.get_objects() if type(o) is _Chain and all(o is not e for e in earlier)]
    finally:
        gc.enable()
    assert counts[1] == counts[0], counts  # as many graphs as the unrolled model's


def test_runs_inside_compile_step_torch_xla_region_with_the_same_losses():
    """torch_xla.compile's lazy region takes the scan as it is; only the dynamo backend is refused."""
    batches = dense_batches(3)
    reference = losses(Stack(), batches, dense_loss, None)
    region = xp.compile_step(backend="torch_xla", full_graph=True)  # full_graph: no host read in the scan
    assert close(losses(Stack(), batches, dense_loss, ("blocks",), region), reference)


@pytest.mark.parametrize("scan", [True, False])
def test_a_backward_before_the_runtime_started_gets_the_clear_error(scan):
    """A CPU backward pass before the runtime starts leaves autograd with no XLA queue (torch's
    internal assert); scan_layers runs a backward inside the forward, so it must be named there too."""
    script = textwrap.dedent(
        """
        import sys, torch, xlapipe as xp
        sys.path.insert(0, sys.argv[1])
        from scan_models import Stack, dense_batches, dense_loss
        assert not xp.runtime.started()
        model = Stack()
        dense_loss(model, dense_batches(1)[0]).backward()  # an eager reference, on the CPU, first
        model.zero_grad()
        transforms = [xp.with_device()] + ([xp.scan_layers("blocks")] if sys.argv[2] == "scan" else [])
        setup = xp.TrainingSetup(model, lambda p: torch.optim.SGD(p, lr=0.1), {"train": dense_batches(2)})
        with xp.session(xp.Pipeline(*transforms)(setup)) as run:
            for batch in run.loaders["train"]:
                run.step(batch, dense_loss)
    """
    )
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    args = [os.path.dirname(__file__), "scan" if scan else "unrolled"]
    out = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: PyTorch's autograd engine started"), out.stderr[-2000:]
    assert "call torch_xla.device() first" in last
