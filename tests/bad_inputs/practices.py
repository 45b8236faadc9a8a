"""Bad inputs: The practices beyond the core: scale-out, static_shapes, compile_step, recompile_guard, hf_traced_masks, torch_xla's practices, scan_layers, with_matmul_precision."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import xlapipe as xp
from bad_inputs.common import Case, _enter
from helpers import tiny_model, tiny_setup
from scan_models import Block, Looped, Stack, dense_batches, text_batches, tiny_bert, tiny_gpt2
from xlapipe.transforms import shard_data, with_compile_cache

SCALE_OUT = [
    Case(
        "shard-mesh-shape",
        "shard_data(mesh_shape=(0,))",
        lambda: shard_data(mesh_shape=(0,)),
        ValueError,
        "mesh_shape must be a non-empty tuple of positive ints",
    ),
    Case(
        "shard-mesh-two-unknowns",
        "shard_data(mesh_shape=(-1, -1), axis_names=('data', 'model'))",
        lambda: shard_data(mesh_shape=(-1, -1), axis_names=("data", "model")),
        ValueError,
        "at most one -1 in mesh_shape",
    ),
    Case(
        "shard-axis-names",
        "shard_data(mesh_shape=(2, 2))",
        lambda: shard_data(mesh_shape=(2, 2)),
        ValueError,
        "axis_names ('data',) must name each of the 2 mesh dimensions",
    ),
    Case(
        "shard-batch-axis",
        "shard_data(batch_axis='batch')",
        lambda: shard_data(batch_axis="batch"),
        ValueError,
        "batch_axis 'batch' is not one of the axis_names",
    ),
    Case(
        "shard-model",
        "shard_data(model='fsdp')",
        lambda: shard_data(model="fsdp"),
        ValueError,
        "model must be 'replicate' or 'shard'",
    ),
    Case(
        "shard-axis-without-shard",
        "shard_data(shard_axis='data')  # model='replicate'",
        lambda: shard_data(shard_axis="data"),
        ValueError,
        "shard_axis='data' needs model='shard'",
    ),
    Case(
        "shard-without-loader",
        "Pipeline(with_device(), shard_data())",
        lambda: xp.Pipeline(xp.with_device(), shard_data()),
        xp.OrderError,
        "shard_data needs wrap_loader_mp before it",
    ),
    Case(
        "shard-mesh-too-big",
        "shard_data(mesh_shape=(3,)) on a runtime with another device count",
        lambda: _enter(
            xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), shard_data(mesh_shape=(3,)))(tiny_setup())
        ),
        ValueError,
        "mesh_shape (3,) needs 3 devices, and this runtime has",
    ),
    Case(
        "cache-path",
        "with_compile_cache('')",
        lambda: with_compile_cache(""),
        ValueError,
        "path (a folder) must be a non-empty string",
    ),
    Case(
        "cache-readonly",
        "with_compile_cache('cache', readonly='yes')",
        lambda: with_compile_cache("cache", readonly="yes"),
        ValueError,
        "readonly must be True or False",
    ),
    Case(
        "cache-without-device",
        "Pipeline(with_compile_cache('cache'))",
        lambda: xp.Pipeline(with_compile_cache("cache")),
        xp.OrderError,
        "with_compile_cache needs with_device before it",
    ),
]


def _long_batch() -> Any:
    data = [{"input_ids": torch.ones(200, dtype=torch.long), "label": 0}] * 2
    collate = lambda items: {"input_ids": torch.stack([i["input_ids"] for i in items])}  # noqa: E731
    loader = torch.utils.data.DataLoader(data, batch_size=2, collate_fn=collate)
    setup = xp.static_shapes(length=128)(xp.TrainingSetup(tiny_model(), None, {"train": loader}))
    return next(iter(setup.loaders["train"]))


STATIC_SHAPES: list[Case] = [
    Case(
        "static-neither",
        "static_shapes()",
        lambda: xp.static_shapes(),
        ValueError,
        "static_shapes needs exactly one of length",
    ),
    Case(
        "static-both",
        "static_shapes(length=128, buckets=(64, 128))",
        lambda: xp.static_shapes(length=128, buckets=(64, 128)),
        ValueError,
        "static_shapes needs exactly one of length",
    ),
    Case(
        "static-length",
        "static_shapes(length=0)",
        lambda: xp.static_shapes(length=0),
        ValueError,
        "length must be positive ints",
    ),
    Case(
        "static-buckets-dup",
        "static_shapes(buckets=(64, 64))",
        lambda: xp.static_shapes(buckets=(64, 64)),
        ValueError,
        "buckets must be distinct",
    ),
    Case(
        "static-after-loader-mp",
        "Pipeline(with_device(), wrap_loader_mp(), static_shapes(length=128))",
        lambda: xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), xp.static_shapes(length=128)),
        xp.OrderError,
        "wrap_loader_mp must come after static_shapes",
    ),
    Case(
        "static-not-dataloader",
        "static_shapes(length=128) on loaders={'train': [batch, ...]}",
        lambda: xp.static_shapes(length=128)(xp.TrainingSetup(tiny_model(), None, {"train": [1, 2]})),
        TypeError,
        "static_shapes rebuilds torch.utils.data.DataLoader objects",
    ),
    Case(
        "static-too-long",
        "static_shapes(length=128) on a batch 200 tokens long",
        _long_batch,
        ValueError,
        "a batch is 200 long, more than length=128",
    ),
]


COMPILE_STEP: list[Case] = [
    Case(
        "compile-backend",
        "compile_step(backend='inductor')",
        lambda: xp.compile_step(backend="inductor"),
        ValueError,
        "backend 'inductor' is not supported",
    ),
    Case(
        "compile-no-device",
        "Pipeline(compile_step())",
        lambda: xp.Pipeline(xp.compile_step()),
        xp.OrderError,
        "compile_step needs with_device before it",
    ),
    Case(
        "compile-spmd",
        "Pipeline(with_device(), wrap_loader_mp(), shard_data(), compile_step())",
        lambda: xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), xp.shard_data(), xp.compile_step()),
        xp.OrderError,
        "excludes",
    ),
]


RECOMPILE_GUARD: list[Case] = [
    Case(
        "guard-warmup",
        "recompile_guard(warmup=-1)",
        lambda: xp.recompile_guard(warmup=-1),
        ValueError,
        "warmup must be a non-negative int",
    ),
    Case(
        "guard-action",
        "recompile_guard(action='ignore')",
        lambda: xp.recompile_guard(action="ignore"),
        ValueError,
        "action must be 'warn' or 'raise'",
    ),
]


HF_TRACED_MASKS: list[Case] = [
    Case(
        "hf-masks-no-device",
        "Pipeline(hf_traced_masks())",
        lambda: xp.Pipeline(xp.hf_traced_masks()),
        xp.OrderError,
        "hf_traced_masks needs with_device before it",
    ),
    Case(
        "hf-masks-not-transformers",
        "Pipeline(with_device(), hf_traced_masks())(setup of an nn.Sequential)",
        lambda: xp.Pipeline(xp.with_device(), xp.hf_traced_masks())(tiny_setup()),
        TypeError,
        "hf_traced_masks applies to transformers models",
    ),
]


TORCH_XLA_PRACTICES: list[Case] = [
    Case(
        "compile-backend-options",
        "compile_step(full_graph=True)",
        lambda: xp.compile_step(full_graph=True),
        ValueError,
        "are options of backend='torch_xla'",
    ),
    Case(
        "compile-torch-xla-optimizer",
        "compile_step(backend='torch_xla', optimizer=True)",
        lambda: xp.compile_step(backend="torch_xla", optimizer=True),
        ValueError,
        "optimizer=True is an option of backend='openxla'",
    ),
    Case(
        "host-reads-compile",
        "Pipeline(with_device(), compile_step(), no_host_reads())",
        lambda: xp.Pipeline(xp.with_device(), xp.compile_step(), xp.no_host_reads()),
        xp.OrderError,
        "no_host_reads excludes compile_step",
    ),
    Case(
        "profile-first-step",
        "profile(steps=(1, 5))",
        lambda: xp.profile(steps=(1, 5)),
        ValueError,
        "start at step 1, which compiles the step's graph",
    ),
    Case(
        "profile-window",
        "profile(steps=(6, 5))",
        lambda: xp.profile(steps=(6, 5)),
        ValueError,
        "steps must be (start, stop) with 1 <= start <= stop",
    ),
]


STATIC_SHAPES_LABELS: list[Case] = [
    Case(
        "static-label-pad-value",
        "static_shapes(length=128, label_pad_value='ignore')",
        lambda: xp.static_shapes(length=128, label_pad_value="ignore"),
        ValueError,
        "label_pad_value must be an int (-100, the index transformers' losses ignore) or None",
    ),
]


def _scanned(model: nn.Module, layers: Any = None) -> xp.TrainingSetup:
    return xp.Pipeline(xp.with_device(), xp.scan_layers(layers))(xp.TrainingSetup(model))


def _scan_forward(model: nn.Module, layers: Any, call: Callable[[xp.Run], Any] | None = None) -> Any:
    """Run one forward pass of ``model`` with ``layers`` scanned (the dense models' input by default)."""
    with xp.session(_scanned(model, layers)) as run:
        if call is not None:
            return call(run)
        return run.model(dense_batches(1)[0][0].to(run.device))


def _text(run: xp.Run, **kwargs: Any) -> Any:
    batch = text_batches(1)[0]
    return run.model(
        input_ids=batch["input_ids"].to(run.device),
        attention_mask=batch["attention_mask"].to(run.device),
        **kwargs,
    )


def _per_layer_gates(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    for i, block in enumerate(self.blocks):
        h = block(h, gate * (i + 1))
    return h


def _read_between(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    for block in self.blocks:
        h = torch.tanh(block(h, gate))
    return h


def _collected(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    outs = []
    for block in self.blocks:
        h = block(h, gate)
        outs.append(h)
    return torch.stack(outs).mean(0)


def _parallel(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return torch.stack([block(h, gate) for block in self.blocks]).mean(0)


def _reversed(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    for i in reversed(range(len(self.blocks))):
        h = self.blocks[i](h, gate)
    return h


def _sliced(self: nn.Module, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    for block in self.blocks[:2]:
        h = block(h, gate)
    return h


def _hooked() -> nn.Module:
    model = Stack()
    model.blocks[2].fc1.register_forward_hook(lambda module, args, out: None)
    return model


def _batch_normed() -> nn.Module:
    model = Stack()
    for block in model.blocks:
        block.norm = nn.BatchNorm1d(16)
    return model


def _mixed() -> nn.Module:
    model = Stack()
    model.blocks[3] = Block(16, dropout=0.1)
    return model


def _widened() -> nn.Module:
    model = Stack()
    model.blocks.append(Block(32))
    return model


def _other_activation() -> nn.Module:
    model = Stack()
    model.blocks[1].act = torch.tanh
    return model


class _Halves(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, gate: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc(x)


SCAN_LAYERS: list[Case] = [
    Case(
        "scan-layers-type",
        "scan_layers(layers=['blocks', 3])",
        lambda: xp.scan_layers(("blocks", 3)),
        ValueError,
        "layers must be None (find transformers' stacks)",
    ),
    Case(
        "scan-no-device",
        "Pipeline(scan_layers())",
        lambda: xp.Pipeline(xp.scan_layers()),
        xp.OrderError,
        "scan_layers needs with_device before it",
    ),
    Case(
        "scan-compile-step",
        "Pipeline(with_device(), compile_step(), scan_layers())",
        lambda: xp.Pipeline(xp.with_device(), xp.compile_step(), xp.scan_layers()),
        xp.OrderError,
        "compile_step excludes scan_layers: with backend='openxla' dynamo traces the step with fake tensors",
    ),
    Case(
        "scan-then-compile-step",
        "Pipeline(with_device(), scan_layers(), compile_step())",
        lambda: xp.Pipeline(xp.with_device(), xp.scan_layers(), xp.compile_step()),
        xp.OrderError,
        "Use compile_step(backend='torch_xla'), which runs the scanned step as one lazy region",
    ),
    Case(
        "scan-then-compile-step-applied",
        "compile_step()(Pipeline(with_device(), scan_layers())(setup))",
        lambda: xp.compile_step()(
            xp.Pipeline(xp.with_device(), xp.scan_layers())(xp.TrainingSetup(tiny_bert()))
        ),
        xp.OrderError,
        "compile_step excludes scan_layers",
    ),
    Case(
        "scan-spmd",
        "Pipeline(with_device(), wrap_loader_mp(), shard_data(), scan_layers())",
        lambda: xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(), shard_data(), xp.scan_layers()),
        xp.OrderError,
        "scan_layers excludes shard_data",
    ),
    Case(
        "scan-nothing-found",
        "scan_layers() on a model without BertEncoder or GPT2Model",
        lambda: _scanned(Stack()),
        ValueError,
        "scan_layers found no stack of layers to scan in Stack",
    ),
    Case(
        "scan-no-such-path",
        "scan_layers('layers') on a model whose list is called blocks",
        lambda: _scanned(Stack(), "layers"),
        ValueError,
        "has no module at 'layers'",
    ),
    Case(
        "scan-not-a-list",
        "scan_layers('head') naming an nn.Linear",
        lambda: _scanned(Stack(), "head"),
        TypeError,
        "'head' is a Linear; scan_layers scans an nn.ModuleList",
    ),
    Case(
        "scan-one-layer",
        "scan_layers('blocks') on a list of one block",
        lambda: _scanned(Stack(depth=1), "blocks"),
        ValueError,
        "holds 1 layer(s); there is nothing to scan",
    ),
    Case(
        "scan-nested",
        "scan_layers(('1', '1.0')) naming a stack and a module inside it",
        lambda: _scanned(
            nn.Sequential(
                nn.Linear(8, 8),
                nn.Sequential(
                    nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)),
                    nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)),
                ),
            ),
            ("1", "1.0"),
        ),
        ValueError,
        "'1.0' lies inside '1'",
    ),
    Case(
        "scan-differing-modules",
        "scan_layers('blocks') where one block has dropout 0.1, the others 0.0",
        lambda: _scanned(_mixed(), "blocks"),
        ValueError,
        "layer 3 of 'blocks' differs from layer 0 in its attributes",
    ),
    Case(
        "scan-differing-shapes",
        "scan_layers('blocks') where one block is wider",
        lambda: _scanned(_widened(), "blocks"),
        ValueError,
        "layer 4 of 'blocks' differs from layer 0 in its parameters",
    ),
    Case(
        "scan-differing-functions",
        "scan_layers('blocks') where one block uses tanh, the others relu",
        lambda: _scanned(_other_activation(), "blocks"),
        ValueError,
        "layer 1 of 'blocks' differs from layer 0 in its attributes",
    ),
    Case(
        "scan-kv-cache",
        "GPT-2 with scan_layers(), called without use_cache=False",
        lambda: _scan_forward(tiny_gpt2(), None, _text),
        xp.ScanLayersError,
        "A KV cache is filled layer by layer and a scanned stack cannot honour it",
    ),
    Case(
        "scan-hidden-states",
        "BERT with scan_layers(), called with output_hidden_states=True",
        lambda: _scan_forward(tiny_bert(), None, lambda run: _text(run, output_hidden_states=True)),
        xp.ScanLayersError,
        "transformers is recording per-layer outputs",
    ),
    Case(
        "scan-per-layer-input",
        "for i, block in enumerate(self.blocks): h = block(h, gate * (i + 1))",
        lambda: _scan_forward(Looped(_per_layer_gates), "blocks"),
        xp.ScanLayersError,
        "layer 1 of 'blocks' got another 'gate' than layer 0",
    ),
    Case(
        "scan-read-between",
        "for block in self.blocks: h = torch.tanh(block(h, gate))",
        lambda: _scan_forward(Looped(_read_between), "blocks"),
        xp.ScanLayersError,
        "the output of layer 0 of 'blocks' was used (in tanh) before the last layer ran",
    ),
    Case(
        "scan-collected",
        "outs.append(block(h, gate)) for every block, then torch.stack(outs)",
        lambda: _scan_forward(Looped(_collected), "blocks"),
        xp.ScanLayersError,
        "the output of layer 0 of 'blocks' was used (in stack) before the last layer ran",
    ),
    Case(
        "scan-parallel",
        "torch.stack([block(h, gate) for block in self.blocks])  # not a chain",
        lambda: _scan_forward(Looped(_parallel), "blocks"),
        xp.ScanLayersError,
        "layer 1 of 'blocks' got an input that is not layer 0's output",
    ),
    Case(
        "scan-out-of-order",
        "for i in reversed(range(len(self.blocks))): h = self.blocks[i](h, gate)",
        lambda: _scan_forward(Looped(_reversed), "blocks"),
        xp.ScanLayersError,
        "layer 3 of 'blocks' was called before layer 0",
    ),
    Case(
        "scan-sliced",
        "for block in self.blocks[:2]: h = block(h, gate)",
        lambda: _scan_forward(Looped(_sliced), "blocks"),
        xp.ScanLayersError,
        "'blocks' was sliced",
    ),
    Case(
        "scan-hook",
        "blocks[2].fc1.register_forward_hook(...) with scan_layers('blocks')",
        lambda: _scan_forward(_hooked(), "blocks"),
        xp.ScanLayersError,
        "layer 2 (fc1) of 'blocks' has forward hooks",
    ),
    Case(
        "scan-batch-norm",
        "scan_layers('blocks') on blocks holding BatchNorm1d, in training",
        lambda: _scan_forward(_batch_normed(), "blocks"),
        xp.ScanLayersError,
        "layer 0 (norm) of 'blocks' updates running statistics in training",
    ),
    Case(
        "scan-shape-change",
        "scan_layers on blocks that map width 16 to 8",
        lambda: _scan_forward(_halves_stack(), "blocks"),
        xp.ScanLayersError,
        "a scanned layer must return a tensor of the shape and dtype it takes",
    ),
]


def _halves_stack() -> nn.Module:
    model = Stack()
    model.blocks = nn.ModuleList([_Halves() for _ in range(3)])
    return model


MATMUL_PRECISION: list[Case] = [
    Case(
        "matmul-level",
        "with_matmul_precision('bf16')",
        lambda: xp.with_matmul_precision("bf16"),
        ValueError,
        "level must be 'default', 'high' or 'highest'",
    ),
    Case(
        "matmul-no-device",
        "Pipeline(with_matmul_precision('high'))",
        lambda: xp.Pipeline(xp.with_matmul_precision("high")),
        xp.OrderError,
        "with_matmul_precision needs with_device before it",
    ),
]
