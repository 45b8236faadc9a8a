"""launch: replicas forked from a parent that built the model, results handed back."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from xlapipe import runtime
from xlapipe.launch import launch

# Runs in a fresh process: the test process has started torch_xla's runtime
# (conftest), and a started runtime is exactly what launch refuses.
SCRIPT = textwrap.dedent("""
    import json, os, pickle
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ.pop("CPU_NUM_DEVICES", None)
    import torch
    from torch import nn
    import xlapipe as xp
    from xlapipe import runtime
    from xlapipe.launch import launch

    out = {"parent": os.getpid()}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    setup = xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1), {"train": loader})
    setup = xp.Pipeline(xp.with_device(), xp.wrap_model_mp(), xp.wrap_loader_mp())(setup)
    loss_fn = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])

    def train(index, setup, epochs, tag="x"):   # a closure over loss_fn: nothing is pickled
        with xp.session(setup) as run:
            losses = [float(run.step(b, loss_fn)) for _ in range(epochs) for b in run.loaders["train"]]
            return {"index": index, "pid": os.getpid(), "device": str(run.device),
                    "losses": losses, "tag": tag, "wrapped": type(setup.model).__name__}

    out["result"] = launch(train, setup, 2, tag="y")
    out["started_after_launch"] = runtime.started()
    out["again"] = launch(train, setup, 1)["losses"]

    # XLA_USE_BF16 is read when a runtime starts: launch sets it around the fork.
    bf16 = xp.Pipeline(xp.with_device(), xp.with_precision("bf16", mode="env"))(
        xp.TrainingSetup(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    def env_in_replica(index, setup):
        with xp.session(setup):
            return os.environ.get("XLA_USE_BF16")
    out["env_in_replica"] = launch(env_in_replica, bf16)
    out["env_after"] = os.environ.get("XLA_USE_BF16")

    def fails(index):
        raise ValueError("boom in replica")
    try:
        launch(fails)
    except ValueError as e:
        out["raised"] = str(e)

    try:
        launch(lambda index: (lambda: None))
    except TypeError as e:
        out["unpicklable"] = str(e)

    os.environ["CPU_NUM_DEVICES"] = "2"
    try:
        launch(train, setup, 1)
    except RuntimeError as e:
        out["threads"] = str(e)
    os.environ.pop("CPU_NUM_DEVICES")

    # The reference: the same training, eagerly on the CPU, after the launches
    # (a CPU backward pass before the fork would break the replicas' XLA backward).
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = []
    for _ in range(2):
        for b in loader:
            opt.zero_grad(); loss = loss_fn(model, b); loss.backward(); opt.step(); ref.append(loss.item())
    out["reference"] = ref

    def where(index):  # no backward pass here: the reference above ran one on the CPU
        return {"pid": os.getpid(), "device": str(runtime.device()), "index": index}
    single = launch(where, debug_single_process=True)
    out["single_pid"] = single["pid"]
    out["started_after_single"] = runtime.started()
    try:
        launch(train, setup, 1)
    except RuntimeError as e:
        out["refused"] = str(e)
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def launched():
    env = {k: v for k, v in os.environ.items() if k != "CPU_NUM_DEVICES"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(out for out in proc.stdout.splitlines() if out.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_replica_zero_returns_its_result_from_a_forked_process(launched):
    result = launched["result"]
    assert result["index"] == 0 and result["tag"] == "y"
    assert result["pid"] != launched["parent"]
    assert result["device"].startswith("xla")
    assert result["wrapped"] == "MpModelWrapper"


def test_replicas_train_like_eager_pytorch_and_leave_the_parent_untouched(launched):
    got, want = launched["result"]["losses"], launched["reference"]
    assert len(got) == len(want) == 8
    assert all(abs(g - w) <= 1e-5 * max(1.0, abs(w)) for g, w in zip(got, want))
    assert launched["started_after_launch"] is False  # so the parent can launch again
    assert launched["again"] == got[:4]  # the parent's model and optimizer were not trained


def test_startup_environment_effects_reach_the_replicas_and_are_undone(launched):
    assert launched["env_in_replica"] == "1"
    assert launched["env_after"] is None


def test_errors_in_replicas_reach_the_caller(launched):
    assert launched["raised"] == "boom in replica"
    assert "pickl" in launched["unpicklable"] and "plain data" in launched["unpicklable"]


def test_several_cpu_devices_are_refused_before_they_deadlock(launched):
    assert "CPU_NUM_DEVICES=2" in launched["threads"] and "deadlock" in launched["threads"]


def test_single_process_mode_runs_here_and_then_refuses_to_fork(launched):
    assert launched["single_pid"] == launched["parent"]
    assert launched["started_after_single"] is True
    assert "already started" in launched["refused"]


def test_refuses_once_the_runtime_has_started_in_this_process():
    assert runtime.started()  # conftest touched the device
    with pytest.raises(RuntimeError, match=r"already started.*cannot fork.*realise the setup"):
        launch(lambda index: index)


def test_refuses_what_is_not_a_function():
    with pytest.raises(TypeError, match="function"):
        launch(42)
