"""Every bad input we tried, and the error it must get.

Each case is (id, what the user did, a zero-argument callable doing it, the
exception type, a fragment of the message). ``tests/test_bad_inputs.py``
asserts them; ``tools/error_table.py`` runs them for real and writes
``docs/errors.md``. Run in a process whose XLA runtime has started on the CPU
with one device (as ``tests/conftest.py`` and the tool arrange).

To add cases: append to the list of the section they belong to (or start a
section and add it to ``CASES`` at the bottom), then run
``.venv/bin/python tools/error_table.py``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup
from scan_models import Block, Looped, Stack, dense_batches, text_batches, tiny_bert, tiny_gpt2
from xlapipe import checkpoint
from xlapipe.effects import EnvVar
from xlapipe.transform import Transform
from xlapipe.transforms import shard_data, with_compile_cache

SCRATCH = tempfile.mkdtemp(prefix="xlapipe-bad-inputs-")  # shown as <tmp> in docs/errors.md


class Case(NamedTuple):
    id: str
    did: str  # what the user did, as they would write it
    call: Callable[[], Any]
    raises: type[BaseException]
    fragment: str  # must appear in the message


def message_of(error: BaseException) -> str:
    """What the user reads after the exception's type (KeyError quotes its argument)."""
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error)


def scratch(name: str) -> str:
    return os.path.join(SCRATCH, name)


def _enter(setup: Any) -> None:
    with xp.session(setup):
        pass


def _step(setup: xp.TrainingSetup) -> None:
    with xp.session(setup) as run:
        run.step(next(iter(run.loaders["train"])), loss_fn)


def _with_run(action: Callable[[xp.Run], Any], setup: xp.TrainingSetup | None = None) -> Any:
    with xp.session(setup or xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        return action(run)


def _saved(name: str, scheduler: bool = False) -> str:
    """A real checkpoint of the tiny workload (with a scheduler state when asked)."""
    path = scratch(name)

    def save(run: xp.Run) -> None:
        sched = torch.optim.lr_scheduler.StepLR(run.optimizer, 1) if scheduler else None
        checkpoint.save(path, run, step=1, scheduler=sched)

    _with_run(save)
    return path


def _file(name: str, content: bytes | None = None, obj: Any = None) -> str:
    path = scratch(name)
    if obj is not None:
        torch.save(obj, path)
    else:
        with open(path, "wb") as f:
            f.write(content or b"")
    return path


# -- the core: setup, precision, transforms, pipeline, session, step -------------------

CORE = [
    Case(
        "setup-model-type",
        "TrainingSetup('bert', optimizer)",
        lambda: xp.TrainingSetup("bert"),
        TypeError,
        "model must be a torch.nn.Module",
    ),
    Case(
        "setup-optimizer-type",
        "TrainingSetup(model, optimizer=0.01)",
        lambda: xp.TrainingSetup(tiny_model(), 0.01),
        TypeError,
        "optimizer must be a torch.optim.Optimizer, a function from parameters",
    ),
    Case(
        "setup-loaders-list",
        "TrainingSetup(model, opt, loaders=[loader])",
        lambda: xp.TrainingSetup(tiny_model(), None, [tiny_loader()]),
        TypeError,
        "loaders must be a mapping of names to data loaders",
    ),
    Case(
        "setup-loader-name",
        "TrainingSetup(model, opt, {0: loader})",
        lambda: xp.TrainingSetup(tiny_model(), None, {0: tiny_loader()}),
        TypeError,
        "loader names must be strings",
    ),
    Case(
        "setup-loader-not-iterable",
        "TrainingSetup(model, opt, {'train': 64})",
        lambda: xp.TrainingSetup(tiny_model(), None, {"train": 64}),
        TypeError,
        "loader 'train' is not iterable",
    ),
    Case(
        "setup-device",
        "TrainingSetup(model, device='tpu')",
        lambda: xp.TrainingSetup(tiny_model(), device="tpu"),
        ValueError,
        "device must be 'cpu' or 'xla', got 'tpu'",
    ),
    Case(
        "precision-name",
        "with_precision('fp8')",
        lambda: xp.with_precision("fp8"),
        ValueError,
        "unknown precision 'fp8'; choose one of",
    ),
    Case(
        "precision-mode",
        "with_precision('bf16', mode='amp')",
        lambda: xp.with_precision("bf16", mode="amp"),
        ValueError,
        "unknown precision mode 'amp'",
    ),
    Case(
        "precision-fp16-downcast",
        "with_precision('fp16', mode='downcast')",
        lambda: xp.with_precision("fp16", mode="downcast"),
        ValueError,
        "fp16 downcast cannot train",
    ),
    Case(
        "precision-fp16-env",
        "with_precision('fp16', mode='env')",
        lambda: xp.with_precision("fp16", mode="env"),
        ValueError,
        "fp16 has no environment route",
    ),
    Case(
        "pipeline-duplicate",
        "Pipeline(with_device(), with_device())",
        lambda: xp.Pipeline(xp.with_device(), xp.with_device()),
        xp.OrderError,
        "with_device appears twice",
    ),
    Case(
        "pipeline-missing-need",
        "Pipeline(wrap_loader_mp())",
        lambda: xp.Pipeline(xp.wrap_loader_mp()),
        xp.OrderError,
        "wrap_loader_mp needs with_device before it, and there is no with_device",
    ),
    Case(
        "pipeline-wrong-order",
        "Pipeline(wrap_loader_mp(), with_device())",
        lambda: xp.Pipeline(xp.wrap_loader_mp(), xp.with_device()),
        xp.OrderError,
        "but with_device comes after it: move with_device before wrap_loader_mp",
    ),
    Case(
        "pipeline-excludes",
        "Pipeline(with_device(), wrap_model_mp(), wrap_loader_mp(), shard_data())",
        lambda: xp.Pipeline(xp.with_device(), xp.wrap_model_mp(), xp.wrap_loader_mp(), shard_data()),
        xp.OrderError,
        "wrap_model_mp excludes shard_data",
    ),
    Case(
        "pipeline-factory",
        "Pipeline(with_device)",
        lambda: xp.Pipeline(xp.with_device),
        TypeError,
        "did you pass the factory",
    ),
    Case(
        "pipeline-add-present",
        "Pipeline(with_device()).add(with_device())",
        lambda: xp.Pipeline(xp.with_device()).add(xp.with_device()),
        xp.OrderError,
        "with_device is already in",
    ),
    Case(
        "pipeline-without-absent",
        "Pipeline(with_device()).without('wrap_loader_mp')",
        lambda: xp.Pipeline(xp.with_device()).without("wrap_loader_mp"),
        KeyError,
        "no wrap_loader_mp in Pipeline: with_device()",
    ),
    Case(
        "pipeline-on-model",
        "Pipeline(with_device())(model)",
        lambda: xp.Pipeline(xp.with_device())(tiny_model()),
        TypeError,
        "a pipeline applies to a TrainingSetup, got Sequential",
    ),
    Case(
        "transform-on-model",
        "with_device()(model)",
        lambda: xp.with_device()(tiny_model()),
        TypeError,
        "with_device applies to a TrainingSetup, got Sequential",
    ),
    Case(
        "transform-twice",
        "with_precision('fp16')(with_precision('bf16')(setup))",
        lambda: xp.with_precision("fp16")(xp.with_precision("bf16")(tiny_setup())),
        ValueError,
        "with_precision was already applied to this setup with mode='autocast', name='bf16'",
    ),
    Case(
        "transform-params-not-plain",
        "Transform('mine', fn, {'model': nn.Linear(2, 2)})",
        lambda: Transform("mine", lambda s, **_: s, {"model": nn.Linear(2, 2)}),
        TypeError,
        "parameter 'model' must be plain data",
    ),
    Case(
        "transform-effect-not-an-effect",
        "Transform('mine', effects=[('XLA_FLAGS', '--xla_foo')])",
        lambda: Transform("mine", effects=[("XLA_FLAGS", "--xla_foo")]),
        TypeError,
        "effects are xlapipe.effects.Effect values",
    ),
    Case(
        "transform-hook-not-a-hook",
        "Transform('mine', hooks=[lambda batch: batch])",
        lambda: Transform("mine", hooks=[lambda batch: batch]),
        TypeError,
        "hooks are xlapipe.hooks.Hook values, got function",
    ),
    Case(
        "transform-excludes",
        "Pipeline(Transform('mine', excludes='yours'), Transform('yours'))",
        lambda: xp.Pipeline(Transform("mine", excludes="yours"), Transform("yours")),
        xp.OrderError,
        "mine excludes yours: they cannot be combined; remove one of them",
    ),
    Case(
        "transform-reason-not-excluded",
        "Transform('mine', excludes='a', reasons={'b': 'why'})",
        lambda: Transform("mine", excludes="a", reasons={"b": "why"}),
        ValueError,
        "reasons are for excluded transforms; b is not in excludes",
    ),
    Case(
        "transform-reason-empty",
        "Transform('mine', excludes='a', reasons={'a': ''})",
        lambda: Transform("mine", excludes="a", reasons={"a": ""}),
        TypeError,
        "reasons maps transform names to non-empty explanations",
    ),
    Case(
        "rebuild-unknown",
        "rebuild('with_tpu', {})",
        lambda: xp.rebuild("with_tpu", {}),
        ValueError,
        "unknown transform 'with_tpu'; known:",
    ),
    Case(
        "loader-mp-size",
        "wrap_loader_mp(loader_prefetch_size=0)",
        lambda: xp.wrap_loader_mp(loader_prefetch_size=0),
        ValueError,
        "wrap_loader_mp: loader_prefetch_size must be a positive int, got 0",
    ),
    Case(
        "loader-mp-threads-type",
        "wrap_loader_mp(host_to_device_transfer_threads=1.5)",
        lambda: xp.wrap_loader_mp(host_to_device_transfer_threads=1.5),
        ValueError,
        "host_to_device_transfer_threads must be a positive int, got 1.5",
    ),
    Case(
        "loader-set-epoch",
        "DeviceLoader(list_of_batches).set_epoch(1)",
        lambda: xp.DeviceLoader([[torch.zeros(2)]]).set_epoch(1),
        AttributeError,
        "have no set_epoch; use a DistributedSampler",
    ),
    Case(
        "default-dtype",
        "set_default_tensor_type('int8')",
        lambda: xp.set_default_tensor_type("int8"),
        ValueError,
        "set_default_tensor_type: dtype must be 'float32', 'float64', 'bfloat16' or 'float16', got 'int8'",
    ),
    Case(
        "default-device",
        "set_default_tensor_type(device='cuda')",
        lambda: xp.set_default_tensor_type(device="cuda"),
        ValueError,
        "device must be None, 'cpu' or 'xla', got 'cuda'",
    ),
    Case(
        "session-on-model",
        "with session(model): ...",
        lambda: _enter(tiny_model()),
        TypeError,
        "session takes a TrainingSetup, got Sequential",
    ),
    Case(
        "step-without-optimizer",
        "run.step(batch, loss_fn) with TrainingSetup(model) (no optimizer)",
        lambda: _step(xp.TrainingSetup(tiny_model(), None, {"train": tiny_loader()})),
        ValueError,
        "a training step needs an optimizer",
    ),
    Case(
        "optimizer-other-model",
        "TrainingSetup(model, SGD(other_model.parameters())) on the device",
        lambda: _enter(
            xp.with_device()(
                xp.TrainingSetup(tiny_model(), torch.optim.SGD(tiny_model(1).parameters(), lr=0.1))
            )
        ),
        ValueError,
        "of the optimizer's parameters are not in the model being moved",
    ),
    Case(
        "env-after-runtime",
        "with_precision('bf16', mode='env') once the XLA runtime has started",
        lambda: _enter(xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"))(tiny_setup())),
        RuntimeError,
        "XLA_USE_BF16=1 is read once when torch_xla's runtime starts",
    ),
    Case(
        "env-effect-after-runtime",
        "EnvVar('PJRT_DEVICE', 'TPU').apply() once the runtime has started",
        lambda: EnvVar("PJRT_DEVICE", "TPU").apply(),
        RuntimeError,
        "PJRT_DEVICE=TPU is read once when torch_xla's runtime starts",
    ),
]

# -- scale-out: shard_data, with_compile_cache -------------------------------------------

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

# -- checkpoints ------------------------------------------------------------------------------

CHECKPOINT = [
    Case(
        "ckpt-save-model",
        "checkpoint.save(path, model, step=1)",
        lambda: checkpoint.save(scratch("m.pt"), tiny_model(), step=1),
        TypeError,
        "save takes the Run that xlapipe.session(...) yields, got Sequential",
    ),
    Case(
        "ckpt-save-step",
        "checkpoint.save(path, run, step=-1)",
        lambda: _with_run(lambda run: checkpoint.save(scratch("s.pt"), run, step=-1)),
        ValueError,
        "step must be a non-negative int, got -1",
    ),
    Case(
        "ckpt-missing",
        "checkpoint.restore('missing.pt', run)",
        lambda: _with_run(lambda run: checkpoint.restore(scratch("missing.pt"), run)),
        FileNotFoundError,
        "no checkpoint at",
    ),
    Case(
        "ckpt-not-torch",
        "checkpoint.load(path_of_a_text_file)",
        lambda: checkpoint.load(_file("notes.txt", b"step=3\n")),
        ValueError,
        "is not a readable xlapipe checkpoint",
    ),
    Case(
        "ckpt-foreign",
        "checkpoint.load(path) of torch.save(model.state_dict(), path)",
        lambda: checkpoint.load(_file("weights.pt", obj=tiny_model().state_dict())),
        ValueError,
        "is not an xlapipe checkpoint (expected format 'xlapipe-checkpoint/3')",
    ),
    Case(
        "ckpt-scheduler-missing",
        "checkpoint.restore(path, run) of a checkpoint saved with a scheduler",
        lambda: _with_run(lambda run: checkpoint.restore(_saved("sched.pt", scheduler=True), run)),
        ValueError,
        "the checkpoint holds scheduler state and this run has no scheduler",
    ),
    Case(
        "ckpt-other-model",
        "checkpoint.restore(path, run) into a run of another architecture",
        lambda: _with_run(
            lambda run: checkpoint.restore(_saved("tiny.pt"), run),
            xp.with_device()(xp.TrainingSetup(nn.Linear(8, 2), lambda p: torch.optim.SGD(p, lr=0.1))),
        ),
        ValueError,
        "the checkpoint's model does not fit this run's model (not in the checkpoint: bias, weight",
    ),
    Case(
        "ckpt-no-optimizer",
        "checkpoint.restore(path, run) into a run without an optimizer",
        lambda: _with_run(
            lambda run: checkpoint.restore(_saved("tiny.pt"), run),
            xp.with_device()(xp.TrainingSetup(tiny_model())),
        ),
        ValueError,
        "the checkpoint holds optimizer state and this run has no optimizer",
    ),
]

# -- static_shapes, compile_step, recompile_guard ----------------------------------------------
# Their authors' bad inputs go here (the lead adds them): Case(id, did, call, raises, fragment).


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


def _lambda_sink_description() -> Any:
    return xp.Pipeline(xp.log_every(5, to=lambda record: None)).describe()


def _attached_scheduler() -> None:
    setup = tiny_setup()
    torch.optim.lr_scheduler.StepLR(setup.optimizer, step_size=1)
    _enter(xp.with_device()(setup))


def _loss_returning(value: Any) -> None:
    with xp.session(xp.with_device()(tiny_setup())) as run:
        run.step(next(iter(run.loaders["train"])), lambda m, b: value)


def _step_after_session() -> None:
    with xp.session(xp.with_device()(tiny_setup())) as run:
        batch = next(iter(run.loaders["train"]))
    run.step(batch, loss_fn)


def _on_device_without_with_device() -> None:
    _enter(xp.TrainingSetup(tiny_model().to("xla:0"), None))


def _misnamed_factory() -> Any:
    def other() -> Transform:
        return Transform("not_other", params={})

    return xp.register(other)


STEP_FEATURES: list[Case] = [
    Case(
        "accumulate-steps",
        "accumulate_grad(0)",
        lambda: xp.accumulate_grad(0),
        ValueError,
        "steps must be a positive int",
    ),
    Case(
        "accumulate-last-window",
        "accumulate_grad(4, last_window='accelerate')",
        lambda: xp.accumulate_grad(4, last_window="accelerate"),
        ValueError,
        "last_window must be 'average' or 'divide_by_steps'",
    ),
    Case(
        "clip-max-norm",
        "clip_grad_norm(-1.0)",
        lambda: xp.clip_grad_norm(-1.0),
        ValueError,
        "max_norm must be a positive finite number",
    ),
    Case(
        "clip-norm-type",
        "clip_grad_norm(1.0, norm_type='l2')",
        lambda: xp.clip_grad_norm(1.0, norm_type="l2"),
        ValueError,
        "norm_type must be a positive finite number",
    ),
    Case("log-every", "log_every(0)", lambda: xp.log_every(0), ValueError, "every must be a positive int"),
    Case(
        "log-sink",
        "log_every(5, to='stdout')",
        lambda: xp.log_every(5, to="stdout"),
        ValueError,
        "to must be 'print', 'progress', 'module:function' or a function",
    ),
    Case(
        "log-lambda-describe",
        "Pipeline(log_every(5, to=lambda r: ...)).describe()",
        _lambda_sink_description,
        TypeError,
        "define it at the top level of an importable module",
    ),
    Case(
        "scheduler-instance",
        "TrainingSetup(model, opt, scheduler=StepLR(opt, 1))",
        lambda: xp.TrainingSetup(
            tiny_model(),
            None,
            scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.SGD(tiny_model().parameters(), lr=0.1), 1),
        ),
        TypeError,
        "scheduler must be a function of the optimizer",
    ),
    Case(
        "scheduler-attached",
        "StepLR(setup.optimizer, 1); session(with_device()(setup))",
        _attached_scheduler,
        ValueError,
        "a learning-rate scheduler was built on the optimizer in this setup",
    ),
    Case(
        "loss-float",
        "run.step(batch, lambda m, b: 0.5)",
        lambda: _loss_returning(0.5),
        TypeError,
        "returned a float; it must return the loss as a scalar tensor",
    ),
    Case(
        "loss-none",
        "run.step(batch, lambda m, b: None)",
        lambda: _loss_returning(None),
        TypeError,
        "returned a NoneType",
    ),
    Case(
        "loss-not-scalar",
        "run.step(batch, lambda m, b: torch.ones(3, requires_grad=True))",
        lambda: _loss_returning(torch.ones(3, requires_grad=True)),
        ValueError,
        "the loss must be a scalar",
    ),
    Case(
        "loss-detached",
        "run.step(batch, lambda m, b: torch.tensor(1.0))",
        lambda: _loss_returning(torch.tensor(1.0)),
        ValueError,
        "does not depend on any trainable parameter",
    ),
    Case(
        "step-after-session",
        "run.step(...) after `with session(...) as run:` ended",
        _step_after_session,
        RuntimeError,
        "this run's session has ended",
    ),
    Case(
        "model-on-device",
        "session(TrainingSetup(model.to('xla:0'), ...)) without with_device",
        _on_device_without_with_device,
        ValueError,
        "the model's weights are on the XLA device",
    ),
    Case(
        "register-misnamed",
        "register(other) where other() builds Transform('not_other')",
        _misnamed_factory,
        ValueError,
        "the factory other builds a transform named 'not_other'",
    ),
    Case(
        "transform-fn-params",
        "Transform('mine', lambda setup: setup, {'level': 2})",
        lambda: Transform("mine", lambda setup: setup, {"level": 2}),
        TypeError,
        "fn must take the setup and the parameters as keywords",
    ),
    Case(
        "description-not-list",
        "Pipeline.from_description({'name': 'with_device'})",
        lambda: xp.Pipeline.from_description({"name": "with_device"}),
        ValueError,
        "a pipeline description is a list",
    ),
    Case(
        "description-no-name",
        "Pipeline.from_description([{'params': {}}])",
        lambda: xp.Pipeline.from_description([{"params": {}}]),
        ValueError,
        'must be an object with a "name"',
    ),
    Case(
        "description-null-params",
        "Pipeline.from_description([{'name': 'with_device', 'params': None}])",
        lambda: xp.Pipeline.from_description([{"name": "with_device", "params": None}]),
        ValueError,
        "the params of item 0 (with_device) must be an object",
    ),
    Case(
        "description-unknown-param",
        "Pipeline.from_description([{'name': 'wrap_loader_mp', 'params': {'size': 2}}])",
        lambda: xp.Pipeline.from_description([{"name": "wrap_loader_mp", "params": {"size": 2}}]),
        ValueError,
        "cannot rebuild wrap_loader_mp",
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

# -- checkpoints: what cannot load back, damaged files, runs they do not fit (issue 11) ------------


def _save_extra(extra: Any) -> None:
    _with_run(lambda run: checkpoint.save(scratch("extra.pt"), run, step=1, extra=extra))


def _restore_into(setup: xp.TrainingSetup, path: str) -> None:
    _with_run(lambda run: checkpoint.restore(path, run), xp.with_device()(setup))


def _damaged(name: str) -> str:
    """A real checkpoint with one bit flipped inside the model's first weight."""
    path = _saved(name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = bytes(data).find(checkpoint.load(path)["model"]["0.weight"].numpy().tobytes()) + 3
    data[at] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)
    return path


def _own_generator(shuffle: bool) -> xp.TrainingSetup:
    loader = torch.utils.data.DataLoader(
        tiny_loader().dataset, batch_size=16, shuffle=shuffle, generator=torch.Generator().manual_seed(0)
    )
    return tiny_setup().evolve(loaders={"train": loader})


def _other_head() -> xp.TrainingSetup:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def _two_groups() -> xp.TrainingSetup:
    model = tiny_model()
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters()}]
    return xp.TrainingSetup(model, torch.optim.SGD(groups, lr=0.1, momentum=0.9))


CHECKPOINT_SAFETY: list[Case] = [
    Case(
        "ckpt-extra-numpy-scalar",
        "checkpoint.save(path, run, step=1, extra={'lr': np.float64(1e-3)})",
        lambda: _save_extra({"lr": np.float64(1e-3)}),
        TypeError,
        "extra['lr'] is of type numpy.float64, which checkpoint.load cannot read back",
    ),
    Case(
        "ckpt-extra-numpy-array",
        "checkpoint.save(path, run, step=1, extra={'seen': np.arange(3)})",
        lambda: _save_extra({"seen": np.arange(3)}),
        TypeError,
        "torch.from_numpy(value) or value.tolist()",
    ),
    Case(
        "ckpt-extra-datetime",
        "checkpoint.save(path, run, step=1, extra={'at': datetime.now()})",
        lambda: _save_extra({"at": datetime.datetime(2024, 5, 1)}),
        TypeError,
        "Store a string (value.isoformat())",
    ),
    Case(
        "ckpt-extra-path",
        "checkpoint.save(path, run, step=1, extra={'out': pathlib.Path('runs')})",
        lambda: _save_extra({"out": pathlib.Path("runs")}),
        TypeError,
        "Store a string (str(value))",
    ),
    Case(
        "ckpt-extra-namespace",
        "checkpoint.save(path, run, step=1, extra={'args': parser.parse_args()})",
        lambda: _save_extra({"args": argparse.Namespace(lr=0.1)}),
        TypeError,
        "Store a dict (vars(value))",
    ),
    Case(
        "ckpt-extra-not-dict",
        "checkpoint.save(path, run, step=1, extra=[1, 2])",
        lambda: _save_extra([1, 2]),
        TypeError,
        "extra must be a dict of plain data",
    ),
    Case(
        "ckpt-format-only",
        "checkpoint.load(path) of torch.save({'format': checkpoint.FORMAT}, path)",
        lambda: checkpoint.load(_file("format-only.pt", obj={"format": checkpoint.FORMAT})),
        ValueError,
        "is not a whole xlapipe checkpoint: it lacks digest, step, run, model",
    ),
    Case(
        "ckpt-format-1",
        "checkpoint.load(path) of a checkpoint written by xlapipe before format 2",
        lambda: checkpoint.load(_file("v1.pt", obj={"format": "xlapipe-checkpoint/1", "step": 1})),
        ValueError,
        "was written by an earlier xlapipe (format 'xlapipe-checkpoint/1')",
    ),
    Case(
        "ckpt-flipped-byte",
        "checkpoint.load(path) of a checkpoint with a bit flipped inside a weight",
        lambda: checkpoint.load(_damaged("flipped.pt")),
        ValueError,
        "is damaged: its model part does not match the digest written with it",
    ),
    Case(
        "ckpt-optimizer-class",
        "checkpoint.restore(path, run) of an SGD run's checkpoint into an AdamW run",
        lambda: _restore_into(tiny_setup("adamw"), _saved("sgd.pt")),
        ValueError,
        "holds the state of a torch.optim.sgd.SGD optimizer and this run's optimizer is a "
        "torch.optim.adamw.AdamW",
    ),
    Case(
        "ckpt-shapes",
        "checkpoint.restore(path, run) into a run whose last layer has 3 outputs, not 2",
        lambda: _restore_into(_other_head(), _saved("tiny.pt")),
        ValueError,
        "other shapes: 2.weight: (2, 16) saved, (3, 16) here",
    ),
    Case(
        "ckpt-param-groups",
        "checkpoint.restore(path, run) into a run whose optimizer has two parameter groups",
        lambda: _restore_into(_two_groups(), _saved("tiny.pt")),
        ValueError,
        "optimizer has parameter groups of [4] parameters and this run's has [2, 2]",
    ),
    Case(
        "ckpt-loader-generator",
        "checkpoint.restore(path, run) into a run whose loader now has generator=g",
        lambda: _restore_into(_own_generator(shuffle=False), _saved("tiny.pt")),
        ValueError,
        "Build the loaders as the saving run did",
    ),
    Case(
        "ckpt-loader-changed",
        "checkpoint.restore(path, run) into a run whose loader now shuffles",
        lambda: _restore_into(_own_generator(shuffle=True), _saved("tiny.pt")),
        ValueError,
        "its sampler was 'SequentialSampler' and is 'RandomSampler' in this run",
    ),
]

# -- optimizer factories (issue 11) ------------------------------------------------------------------

_USERS_MODEL = tiny_model()

OPTIMIZER_FACTORY: list[Case] = [
    Case(
        "optimizer-factory-returns-other",
        "TrainingSetup(model, lambda params: None) in a session",
        lambda: _enter(xp.with_device()(xp.TrainingSetup(tiny_model(), lambda params: None))),
        TypeError,
        "the optimizer factory returned None, not a torch.optim.Optimizer",
    ),
    Case(
        "optimizer-factory-ignores-params",
        "TrainingSetup(model, lambda params: torch.optim.SGD(model.parameters(), lr=0.1)) in a session",
        lambda: _enter(
            xp.with_device()(
                xp.TrainingSetup(
                    _USERS_MODEL, lambda params: torch.optim.SGD(_USERS_MODEL.parameters(), lr=0.1)
                )
            )
        ),
        ValueError,
        "it must build the optimizer on the parameters it is given",
    ),
]

# -- static_shapes: token labels (issue 11) ------------------------------------------------------------

STATIC_SHAPES_LABELS: list[Case] = [
    Case(
        "static-label-pad-value",
        "static_shapes(length=128, label_pad_value='ignore')",
        lambda: xp.static_shapes(length=128, label_pad_value="ignore"),
        ValueError,
        "label_pad_value must be an int (-100, the index transformers' losses ignore) or None",
    ),
]


# -- scan_layers -------------------------------------------------------------------------------


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


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def _user_rate_under_scheduler() -> None:
    setup = tiny_setup("adamw").evolve(scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt))
    with xp.session(xp.Pipeline(xp.with_device())(setup)) as run:
        batch = next(iter(run.batches("train")))
        setup.optimizer.param_groups[0]["lr"] = 0.5
        run.step(batch, loss_fn)


def _changed_constant_under_compile() -> None:
    compiled = xp.Pipeline(xp.with_device(), xp.compile_step(optimizer=True))
    with xp.session(compiled(tiny_setup("adamw"))) as run:
        for i, batch in enumerate(run.batches("train")):
            run.optimizer.param_groups[0]["weight_decay"] = 0.1 * i
            run.step(batch, loss_fn)


def _zero_rate_under_compiled_update() -> None:
    warm_up = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda u: u / 10)  # noqa: E731
    setup = tiny_setup("adamw").evolve(scheduler=warm_up)
    with xp.session(xp.Pipeline(xp.with_device(), xp.compile_step(optimizer=True))(setup)):
        pass


def _frozen_group_under_compiled_update() -> None:
    model = tiny_model()
    groups = [{"params": model[0].parameters(), "lr": 0.0}, {"params": model[2].parameters()}]
    setup = xp.TrainingSetup(model, torch.optim.AdamW(groups, lr=1e-2), {"train": tiny_loader()})
    with xp.session(xp.Pipeline(xp.with_device(), xp.compile_step(optimizer=True))(setup)):
        pass


def _lstm_under_openxla() -> None:
    model = nn.LSTM(4, 8, 2)
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with xp.session(xp.Pipeline(xp.with_device(), xp.compile_step())(setup)):
        pass


def _save_under_compiled_update() -> None:
    with xp.session(
        xp.Pipeline(xp.with_device(), xp.compile_step(optimizer=True))(tiny_setup("adamw"))
    ) as run:
        run.step(next(iter(run.batches("train"))), loss_fn)
        checkpoint.save(scratch("compiled-update.pt"), run, step=1)


def _save_inside_an_unknown_position() -> None:
    class Stream:
        def __iter__(self):
            return iter(list(tiny_loader()))

    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup().evolve(loaders={"train": Stream()}))) as run:
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
            checkpoint.save(scratch("stream.pt"), run, step=1)


def _dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 2))


def _save_with_compiled_dropout() -> None:
    model = _dropout_model()
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": tiny_loader()})
    with xp.session(xp.Pipeline(xp.with_device(), xp.compile_step())(setup)) as run:
        run.step(next(iter(run.batches("train"))), loss_fn)
        checkpoint.save(scratch("dropout.pt"), run, step=1)


class _Drops(xp.Hook):
    def wrap_apply(self, apply):
        return lambda: None


def _wrapper_that_drops() -> None:
    drops = Transform("drops_the_update", hooks=(_Drops(),))
    with xp.session(xp.Pipeline(xp.with_device(), drops)(tiny_setup())) as run:
        run.step(next(iter(run.batches("train"))), loss_fn)


def _ema_into_plain_run() -> None:
    with xp.session(xp.Pipeline(xp.with_device(), xp.ema(0.9))(tiny_setup())) as run:
        checkpoint.save(scratch("ema.pt"), run, step=0)
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        checkpoint.restore(scratch("ema.pt"), run)


def _averaged_without_ema() -> None:
    with xp.session(xp.Pipeline(xp.with_device())(tiny_setup())) as run:
        xp.averaged_weights(run)


def _empty_checkpoint() -> None:
    open(scratch("empty.pt"), "wb").close()
    checkpoint.load(scratch("empty.pt"))


PROTOCOL_AND_REAL_PATHS: list[Case] = [
    Case(
        "loader-mp-no-loaders",
        "Pipeline(with_device(), wrap_loader_mp())(TrainingSetup(model, optimizer)) (batches fed by hand)",
        lambda: xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(xp.TrainingSetup(tiny_model(), _sgd)),
        ValueError,
        "this setup has none: it would do nothing",
    ),
    Case(
        "static-shapes-no-loaders",
        "Pipeline(static_shapes(length=8))(TrainingSetup(model, optimizer))",
        lambda: xp.Pipeline(xp.static_shapes(length=8))(xp.TrainingSetup(tiny_model(), _sgd)),
        ValueError,
        "this setup has none: it would do nothing",
    ),
    Case(
        "user-rate-under-scheduler",
        "optimizer.param_groups[0]['lr'] = 0.5 on your optimizer, in a run with a scheduler",
        _user_rate_under_scheduler,
        ValueError,
        "this run's learning rate is set by its scheduler",
    ),
    Case(
        "compiled-update-constant-changed",
        "run.optimizer.param_groups[0]['weight_decay'] changed each step under compile_step(optimizer=True)",
        _changed_constant_under_compile,
        xp.CompileStepError,
        "use compile_step(optimizer=False)",
    ),
    Case(
        "compiled-update-zero-rate",
        "a scheduler (a warm-up from a rate of 0) under compile_step(optimizer=True)",
        _zero_rate_under_compiled_update,
        xp.CompileStepError,
        "compile_step(optimizer=True) with a learning-rate scheduler",
    ),
    Case(
        "compiled-update-frozen-group",
        "a parameter group at a rate of 0 under compile_step(optimizer=True)",
        _frozen_group_under_compiled_update,
        xp.CompileStepError,
        "with a learning rate of 0 in parameter group(s) [0]",
    ),
    Case(
        "compile-step-recurrent",
        "an nn.LSTM in the model under compile_step() (backend='openxla')",
        _lstm_under_openxla,
        xp.CompileStepError,
        "Use compile_step(backend='torch_xla')",
    ),
    Case(
        "save-compiled-update",
        "checkpoint.save under compile_step(optimizer=True)",
        _save_under_compiled_update,
        ValueError,
        "Use compile_step(optimizer=False)",
    ),
    Case(
        "save-unknown-position",
        "checkpoint.save inside an epoch of a loader that is a plain iterable",
        _save_inside_an_unknown_position,
        ValueError,
        "whose position inside an epoch xlapipe cannot know",
    ),
    Case(
        "save-compiled-dropout",
        "checkpoint.save under compile_step() with dropout in the model",
        _save_with_compiled_dropout,
        ValueError,
        "Use compile_step(backend='torch_xla'), whose resumes are exact",
    ),
    Case(
        "wrapper-drops-what-it-wraps",
        "a Hook whose wrap_apply returns lambda: None",
        _wrapper_that_drops,
        xp.WrapperError,
        "did not call the function it wraps",
    ),
    Case("ema-decay", "ema(1.5)", lambda: xp.ema(1.5), ValueError, "decay must be a number between 0 and 1"),
    Case(
        "ema-restore-into-plain-run",
        "checkpoint.restore of a run with ema into a run without it",
        _ema_into_plain_run,
        ValueError,
        "this run keeps state for []",
    ),
    Case(
        "averaged-weights-without-ema",
        "xlapipe.averaged_weights(run) of a run without ema",
        _averaged_without_ema,
        ValueError,
        "add xlapipe.ema(decay) to its pipeline",
    ),
    Case(
        "preemption-path",
        "checkpoint_on_preemption('')",
        lambda: xp.checkpoint_on_preemption(""),
        ValueError,
        "path must be a non-empty string",
    ),
    Case(
        "profile-out-is-a-file",
        "profile(out='<an existing file>')",
        lambda: xp.profile(out=_file("a-file.txt", obj=None)),
        ValueError,
        "is a file; it must be a folder",
    ),
    Case(
        "ckpt-empty", "checkpoint.load of an empty file", _empty_checkpoint, ValueError, "is empty (0 bytes)"
    ),
]


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
