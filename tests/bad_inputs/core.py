"""Bad inputs: The core: setup, precision, transforms, pipeline, session, the step and its features, optimizer factories, the practice protocol and the paths real scripts take."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import xlapipe as xp
from bad_inputs.common import Case, _enter, _file, _step, scratch
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup
from xlapipe import checkpoint
from xlapipe.effects import EnvVar
from xlapipe.transform import Transform
from xlapipe.transforms import shard_data

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
