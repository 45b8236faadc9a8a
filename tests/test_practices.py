"""Each practice on its own, on a tiny model, on the real CPU XLA runtime."""

import contextlib
import copy
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch_xla.debug.metrics as met
from torch import nn
from torch_xla.distributed.parallel_loader import MpDeviceLoader
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

import xlapipe as xp
from helpers import loss_fn, tiny_loader, tiny_model, tiny_setup, train_losses
from xlapipe.effects import EnvVar, applied


def markers() -> int:
    return met.counter_value("MarkStep") or 0


# -- with_device -------------------------------------------------------------------


def test_with_device_moves_a_copy_and_rebinds_the_optimizer():
    setup = tiny_setup(optimizer="adamw")
    before = [p.clone() for p in setup.model.parameters()]
    with xp.session(xp.with_device()(setup)) as run:
        params = list(run.model.parameters())
        assert all(p.device.type == "xla" for p in params)
        assert run.optimizer is not setup.optimizer
        assert [id(p) for g in run.optimizer.param_groups for p in g["params"]] == [id(p) for p in params]
        for batch in run.loaders["train"]:
            run.step(batch, loss_fn)
        assert all(s["exp_avg"].device.type == "xla" for s in run.optimizer.state.values())
    # the user's model and optimizer are as they were
    assert all(p.device.type == "cpu" for p in setup.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, setup.model.parameters()))
    assert not setup.optimizer.state
    assert setup.optimizer.param_groups[0]["params"][0] is next(setup.model.parameters())


def test_optimizer_state_from_cpu_steps_moves_with_the_weights():
    # A user who trained a little on the CPU first: AdamW's moments and step count must follow.
    setup = tiny_setup(optimizer="adamw")
    batches = list(setup.loaders["train"])
    for batch in batches[:2]:
        setup.optimizer.zero_grad()
        loss_fn(setup.model, batch).backward()
        setup.optimizer.step()
    reference_model, reference_opt = copy.deepcopy((setup.model, setup.optimizer))
    cpu_state = {
        i: {k: v.clone() for k, v in st.items()} for i, st in enumerate(setup.optimizer.state.values())
    }
    with xp.session(xp.with_device()(setup)) as run:
        moved = list(run.optimizer.state.values())
        assert len(moved) == len(cpu_state) == 4
        for i, st in enumerate(moved):
            assert set(st) == set(cpu_state[i]) == {"step", "exp_avg", "exp_avg_sq"}
            assert st["exp_avg"].device.type == "xla" and st["exp_avg_sq"].device.type == "xla"
            for key, value in cpu_state[i].items():
                assert torch.equal(st[key].cpu(), value), key
        got = [float(run.step(b, loss_fn)) for b in batches[2:]]
    want = []
    for batch in batches[2:]:
        reference_opt.zero_grad()
        loss = loss_fn(reference_model, batch)
        loss.backward()
        reference_opt.step()
        want.append(float(loss.detach()))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-5 * abs(w), (got, want)


def test_with_device_keeps_tied_weights_tied():
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = torch.nn.Sequential(embed, head)
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with xp.session(xp.with_device()(setup)) as run:
        assert run.model[0].weight is run.model[1].weight
        assert run.model[0].weight.device.type == "xla"
        assert len(run.optimizer.param_groups[0]["params"]) == 1


def test_optimizer_factory_is_built_on_the_moved_parameters():
    model = torch.nn.Linear(3, 1)
    setup = xp.TrainingSetup(model, lambda params: torch.optim.SGD(params, lr=0.5))
    with xp.session(xp.with_device()(setup)) as run:
        assert run.optimizer.param_groups[0]["params"][0] is run.model.weight


# -- with_precision ----------------------------------------------------------------


def test_autocast_bf16_runs_matmuls_in_bf16_and_keeps_fp32_weights():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("bf16"))(tiny_setup())
    with xp.session(setup) as run:
        x = torch.randn(2, 8, device=run.device)
        with run.autocast():
            assert run.model(x).dtype == torch.bfloat16
        assert run.model(x).dtype == torch.float32
        assert next(run.model.parameters()).dtype == torch.float32
        assert run.scaler is None


def test_downcast_bf16_converts_the_weights_of_a_copy():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="downcast"))(tiny_setup())
    with xp.session(setup) as run:
        assert {p.dtype for p in run.model.parameters()} == {torch.bfloat16}
        losses = [
            float(run.step(b, lambda m, b: loss_fn(m, (b[0].bfloat16(), b[1])))) for b in run.loaders["train"]
        ]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert {p.dtype for p in setup.model.parameters()} == {torch.float32}


def test_fp16_autocast_uses_a_gradient_scaler_and_trains():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("fp16"))(tiny_setup())
    with xp.session(setup) as run:
        assert isinstance(run.scaler, torch.amp.GradScaler)
        losses = [float(run.step(b, loss_fn)) for _ in range(3) for b in run.loaders["train"]]
        assert run.scaler.get_scale() > 0
    assert losses[-1] < losses[0]


def test_fp16_overflow_backs_the_scaler_off_and_training_goes_on():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("fp16"))(tiny_setup())
    with xp.session(setup) as run:
        batches = list(run.loaders["train"])
        run.step(batches[0], loss_fn)
        scale = run.scaler.get_scale()
        weights = [p.detach().cpu().clone() for p in run.model.parameters()]
        # a loss this large overflows fp16 gradients once scaled: the step must be skipped
        run.step(batches[1], lambda m, b: loss_fn(m, b) * 1e6)
        assert run.scaler.get_scale() == scale * 0.5
        assert all(torch.equal(w, p.detach().cpu()) for w, p in zip(weights, run.model.parameters()))
        losses = [float(run.step(b, loss_fn)) for b in batches[2:]]
        assert run.scaler.get_scale() == scale * 0.5
        assert not all(torch.equal(w, p.detach().cpu()) for w, p in zip(weights, run.model.parameters()))
    assert all(torch.isfinite(torch.tensor(losses)))


def test_precision_alone_works_on_the_cpu_eager_path():
    setup = xp.with_precision("bf16")(tiny_setup())
    losses = train_losses(setup)
    assert setup.device == "cpu" and len(losses) == 4


@pytest.mark.parametrize(
    "name, mode, message",
    [
        ("bf32", "autocast", "unknown precision 'bf32'; choose one of fp32, bf16, fp16"),
        ("bf16", "amp", "unknown precision mode 'amp'; choose one of autocast, downcast, env"),
        ("fp16", "downcast", "fp16 downcast cannot train"),
        ("fp16", "env", "XLA_USE_FP16 is ignored"),
    ],
)
def test_bad_precision_is_refused(name, mode, message):
    with pytest.raises(ValueError, match=message):
        xp.with_precision(name, mode)


def test_env_route_sets_xla_use_bf16_before_the_runtime_starts(tmp_path):
    script = textwrap.dedent(
        """
        import os, torch, torch_xla, xlapipe as xp, sys
        sys.path.insert(0, %r)
        from helpers import tiny_setup, loss_fn
        assert not xp.runtime.started() and "XLA_USE_BF16" not in os.environ
        setup = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"))(tiny_setup())
        assert not xp.runtime.started()
        with xp.session(setup) as run:
            assert os.environ["XLA_USE_BF16"] == "1"
            w = next(run.model.parameters())
            assert "bf16" in torch_xla._XLAC._get_xla_tensors_text([w * 1.0]), "not bf16 on device"
            losses = [float(run.step(b, loss_fn)) for b in run.loaders["train"]]
        assert "XLA_USE_BF16" not in os.environ
        print("LOSSES", losses)
    """
        % os.path.dirname(__file__)
    )
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    env.pop("XLA_USE_BF16", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = eval(out.stdout.split("LOSSES", 1)[1])
    reference = train_losses(xp.with_device()(tiny_setup()))
    assert losses != reference  # bf16 really changed the arithmetic ...
    assert all(abs(a - b) < 2e-2 * abs(b) for a, b in zip(losses, reference))  # ... within bf16 tolerance


def test_environment_effects_come_before_the_default_device_starts_the_runtime():
    # Listed last, XLA_USE_BF16 must still be set before set_default_tensor_type(device="xla")
    # starts the runtime (which reads the variable once).
    script = textwrap.dedent(
        """
        import os, torch, torch_xla, xlapipe as xp, sys
        sys.path.insert(0, %r)
        from helpers import tiny_setup
        pipeline = xp.Pipeline(xp.with_device(), xp.set_default_tensor_type(device="xla"),
                               xp.with_precision("bf16", mode="env"))
        assert [e.before_runtime for e in pipeline.effects][-1] is True  # the env effect comes last
        assert not xp.runtime.started()
        with xp.session(pipeline(tiny_setup())) as run:
            assert os.environ["XLA_USE_BF16"] == "1"
            w = next(run.model.parameters())
            print("BF16" if "bf16" in torch_xla._XLAC._get_xla_tensors_text([w * 1.0]) else "F32")
    """
        % os.path.dirname(__file__)
    )
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    env.pop("XLA_USE_BF16", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "BF16"


def test_env_route_is_refused_once_the_runtime_has_started():
    setup = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"))(tiny_setup())
    before = xp.effects.snapshot()
    with pytest.raises(RuntimeError, match="XLA_USE_BF16=1 is read once when torch_xla's runtime starts"):
        with xp.session(setup):
            pass
    assert xp.effects.snapshot() == before


# -- wrap_model_mp -----------------------------------------------------------------


def test_wrap_model_mp_wraps_once_and_realises_through_the_wrapper():
    user = tiny_setup()
    before = {k: v.clone() for k, v in user.model.state_dict().items()}
    setup = xp.Pipeline(xp.with_device(), xp.wrap_model_mp())(user)
    assert isinstance(setup.model, MpModelWrapper)
    assert xp.wrap_model_mp()(setup) is setup  # idempotent, never re-wrapped
    inner = setup.model._model
    assert inner is not user.model and user.model is not setup.model  # a shallow copy of the tree ...
    shared = {id(t) for t in user.model.state_dict().values()}
    assert {id(t) for t in inner.state_dict().values()} == shared  # ... holding the user's tensors
    with xp.session(setup) as run:
        assert next(run.model.parameters()).device.type == "xla"
        losses = [float(run.step(b, loss_fn)) for b in run.loaders["train"]]
    # the host tensors are the user's, on the CPU and untouched by training
    assert next(inner.parameters()).device.type == "cpu"
    assert all(torch.equal(before[k], v) for k, v in user.model.state_dict().items())
    assert len(losses) == 4


def test_wrap_model_mp_is_refused_when_one_process_drives_several_devices():
    script = textwrap.dedent(
        """
        import sys, torch, xlapipe as xp
        sys.path.insert(0, %r)
        from helpers import tiny_setup
        setup = xp.Pipeline(xp.with_device(), xp.wrap_model_mp())(tiny_setup())
        try:
            with xp.session(setup):
                pass
        except RuntimeError as e:
            print("REFUSED", e)
    """
        % os.path.dirname(__file__)
    )
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED wrap_model_mp shares one module object per process" in out.stdout
    assert "drives 2 XLA devices" in out.stdout


# -- wrap_loader_mp ----------------------------------------------------------------


def test_wrap_loader_mp_keeps_the_loader_interface():
    sampler = torch.utils.data.distributed.DistributedSampler(tiny_loader().dataset, num_replicas=1, rank=0)
    inner = torch.utils.data.DataLoader(tiny_loader().dataset, batch_size=8, sampler=sampler)
    setup = xp.TrainingSetup(torch.nn.Linear(8, 2), None, {"train": inner})
    wrapped = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(device_prefetch_size=2))(setup).loaders["train"]
    assert isinstance(wrapped, MpDeviceLoader)
    assert len(wrapped) == len(inner) == 8
    assert wrapped.dataset is inner.dataset and wrapped.batch_size == 8
    assert wrapped.options["device_prefetch_size"] == 2
    wrapped.set_epoch(3)
    assert sampler.epoch == 3
    assert setup.loaders["train"] is inner
    with pytest.raises(AttributeError, match="no set_epoch"):
        xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(tiny_setup()).loaders["train"].set_epoch(1)


def test_wrap_loader_mp_never_wraps_twice():
    device_loader = MpDeviceLoader(tiny_loader(), torch.device("xla:0"))
    setup = xp.TrainingSetup(torch.nn.Linear(8, 2), None, {"train": device_loader, "eval": tiny_loader()})
    out = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(setup)
    assert out.loaders["train"] is device_loader
    assert isinstance(out.loaders["eval"], xp.DeviceLoader)


def test_device_loader_owns_the_step_markers():
    setup = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(tiny_setup())
    with xp.session(setup) as run:
        assert run.marks_step_elsewhere
        it = iter(run.loaders["train"])
        for batch in it:
            assert batch[0].device.type == "xla"
            before = markers()
            run.step(batch, loss_fn)
            assert markers() == before  # the loader marks the step when it hands out the next batch


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", True])
def test_wrap_loader_mp_refuses_bad_sizes(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        xp.wrap_loader_mp(device_prefetch_size=bad)


def test_leaving_a_device_loader_loop_early_stops_its_threads():
    setup = xp.TrainingSetup(torch.nn.Linear(8, 2), None, {"train": tiny_loader(n=800, batch_size=4)})
    setup = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp(loader_prefetch_size=2, device_prefetch_size=2))(
        setup
    )
    with xp.session(setup) as run:
        threads = threading.active_count()
        for i, _batch in enumerate(run.loaders["train"]):
            assert threading.active_count() > threads
            if i == 1:
                break
        assert threading.active_count() == threads


# -- set_default_tensor_type -------------------------------------------------------


def test_default_dtype_is_applied_in_the_session_and_restored_after_an_error():
    setup = xp.set_default_tensor_type("float64")(tiny_setup())
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(KeyError):
        with xp.session(setup):
            assert torch.get_default_dtype() == torch.float64
            raise KeyError("user code failed")
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("fails", [False, True], ids=["normal-exit", "user-error"])
def test_default_dtype_and_device_come_back_to_what_the_user_had(fails):
    # Start from what the user had, not from torch's defaults: float64 and the XLA device.
    setup = xp.Pipeline(xp.set_default_tensor_type("float32", device="cpu"))(tiny_setup())
    xla = torch.device("xla:0")
    torch.set_default_dtype(torch.float64)
    torch.set_default_device(xla)
    try:
        with pytest.raises(KeyError) if fails else contextlib.nullcontext():
            with xp.session(setup):
                assert torch.get_default_dtype() == torch.float32
                assert torch.get_default_device().type == "cpu"
                if fails:
                    raise KeyError("user code failed")
        assert torch.get_default_dtype() == torch.float64
        assert torch.get_default_device() == xla
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_default_device("cpu")


def test_default_device_xla_puts_new_tensors_on_the_device():
    setup = xp.Pipeline(xp.with_device(), xp.set_default_tensor_type(device="xla"))(tiny_setup())
    with xp.session(setup):
        assert torch.zeros(2).device.type == "xla"
    assert torch.zeros(2).device.type == "cpu"


def test_default_tensor_type_refuses_bad_input():
    with pytest.raises(
        ValueError, match="dtype must be 'float32', 'float64', 'bfloat16' or 'float16', got 'float8'"
    ):
        xp.set_default_tensor_type("float8")
    with pytest.raises(ValueError, match="device must be None, 'cpu' or 'xla'"):
        xp.set_default_tensor_type(device="tpu")
    with pytest.raises(xp.OrderError, match="needs with_device"):
        xp.Pipeline(xp.set_default_tensor_type(device="xla"))


# -- one step marker per step, whatever the combination ----------------------------


@pytest.mark.parametrize("loader_mp", [False, True])
def test_one_step_marker_per_step(loader_mp):
    pipeline = xp.Pipeline(xp.with_device(), *([xp.wrap_loader_mp()] if loader_mp else []))
    with xp.session(pipeline(tiny_setup())) as run:
        start = markers()
        steps = 0
        for batch in run.loaders["train"]:
            run.step(batch, loss_fn)
            steps += 1
            assert markers() - start == steps


def test_an_environment_variable_the_user_had_is_restored_not_deleted(monkeypatch):
    monkeypatch.setenv("XLAPIPE_TEST_VARIABLE", "the user's")
    with applied([EnvVar("XLAPIPE_TEST_VARIABLE", "the session's", before_runtime=False)]):
        assert os.environ["XLAPIPE_TEST_VARIABLE"] == "the session's"
    assert os.environ["XLAPIPE_TEST_VARIABLE"] == "the user's"


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)
        self.register_buffer("positions", torch.arange(8))
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.frozen(x + self.positions.to(x.dtype))))


def test_downcast_keeps_integer_buffers_and_frozen_parameters_stay_frozen():
    model = WithBuffers()
    frozen = model.frozen.weight.detach().clone()
    setup = xp.TrainingSetup(
        model,
        lambda ps: torch.optim.SGD([p for p in ps if p.requires_grad], lr=0.5),
        {"train": tiny_loader()},
    )
    with xp.session(xp.Pipeline(xp.with_device(), xp.with_precision("bf16", "downcast"))(setup)) as run:
        assert run.model.positions.dtype == torch.int64  # integer buffers are not downcast
        assert run.model.head.weight.dtype == torch.bfloat16
        assert not run.model.frozen.weight.requires_grad and run.model.head.weight.requires_grad
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        assert torch.equal(run.model.frozen.weight.detach().cpu().float(), frozen.bfloat16().float())


def test_training_on_the_cpu_never_changes_the_users_model():
    setup = tiny_setup()
    before = {k: v.clone() for k, v in setup.model.state_dict().items()}
    with xp.session(xp.Pipeline()(setup)) as run:  # no practice at all: eager PyTorch on the CPU
        for batch in run.batches("train"):
            run.step(batch, loss_fn)
        assert not torch.equal(run.model[0].weight.detach(), before["0.weight"])
    assert all(torch.equal(v, before[k]) for k, v in setup.model.state_dict().items())


def test_fp16_autocast_computes_in_fp16_on_the_device():
    with xp.session(xp.Pipeline(xp.with_device(), xp.with_precision("fp16"))(tiny_setup())) as run:
        with run.autocast():
            assert run.model(torch.randn(2, 8, device=run.device)).dtype == torch.float16


def test_a_device_loader_iterator_held_past_the_session_stops_with_it():
    before = threading.active_count()
    setup = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())(
        xp.TrainingSetup(tiny_model(), None, {"train": tiny_loader(n=16 * 50)})
    )
    with xp.session(setup) as run:
        held = iter(run.loaders["train"])
        next(held)
        assert threading.active_count() > before
    assert threading.active_count() == before
    del held


def test_wrap_model_mp_keeps_a_model_the_user_already_wrapped():
    wrapped = MpModelWrapper(tiny_model())
    setup = xp.Pipeline(xp.with_device(), xp.wrap_model_mp())(xp.TrainingSetup(wrapped, None))
    assert setup.model is wrapped
    with xp.session(setup) as run:
        assert next(run.model.parameters()).device.type == "xla"


@pytest.mark.parametrize("practice", [xp.wrap_loader_mp(), xp.static_shapes(length=8)], ids=lambda t: t.name)
def test_loader_practices_refuse_a_setup_without_loaders(practice):
    # A script feeding run.step from its own get_batch() got no warning, and an ablation "no difference".
    with pytest.raises(ValueError, match="has none: it would do nothing"):
        xp.Pipeline(xp.with_device(), practice)(
            xp.TrainingSetup(tiny_model(), lambda p: torch.optim.SGD(p, lr=0.1))
        )


def test_profile_refuses_a_file_for_a_folder_and_says_when_its_window_is_never_reached(tmp_path):
    existing = tmp_path / "a-file"
    existing.write_text("")
    with pytest.raises(ValueError, match="is a file; it must be a folder"):
        xp.profile(out=str(existing))
    pipeline = xp.Pipeline(xp.with_device(), xp.profile(steps=(50, 60), out=str(tmp_path / "trace")))
    with pytest.warns(xp.ProfileWarning, match=r"ended after 4 steps, before the window \(steps 50 to 60\)"):
        with xp.session(pipeline(tiny_setup())) as run:
            for batch in run.batches("train"):
                run.step(batch, loss_fn)
