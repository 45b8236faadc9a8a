"""shard_data: SPMD data parallelism on four virtual CPU devices, in a subprocess.

The test process itself drives one device; turning SPMD on cannot be undone
in a process, so every SPMD run happens in a fresh one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch_xla.runtime as xr

import xlapipe as xp
from helpers import tiny_setup, train_losses
from xlapipe.transforms import DeviceLoader, shard_data
from xlapipe.transforms.shard_data import BatchSharding, ShardData, SpmdPlan

HERE = os.path.dirname(os.path.abspath(__file__))
SPMD = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())

# -- the transform as a value (no device touched) ---------------------------------------


def test_records_a_plan_and_gives_the_loaders_a_batch_sharding():
    setup = SPMD.add(
        shard_data(mesh_shape=(2, -1), axis_names=("data", "model"), model="shard", shard_axis="model")
    )(tiny_setup())
    plan = SpmdPlan((2, -1), ("data", "model"), "data", "shard", "model")
    assert ShardData(plan) in setup.hooks
    loader = setup.loaders["train"]
    assert isinstance(loader, DeviceLoader)
    assert loader.options["input_sharding"] == BatchSharding(plan)
    assert loader.options["loader_prefetch_size"] == 16  # wrap_loader_mp's options kept


def test_is_a_value_rebuilt_from_its_description():
    t = shard_data(mesh_shape=[4], model="shard")
    assert xp.rebuild(t.name, json.loads(json.dumps(t.describe()["params"]))) == t
    assert t.needs == {"with_device", "wrap_loader_mp"} and t.excludes == {"wrap_model_mp"}


def test_excludes_per_replica_model_wrapping():
    with pytest.raises(xp.OrderError, match="wrap_model_mp excludes shard_data"):
        xp.Pipeline(xp.with_device(), xp.wrap_model_mp(), xp.wrap_loader_mp(), shard_data())


def test_mesh_larger_than_the_runtime_is_refused_before_spmd_is_on():
    setup = SPMD.add(shard_data(mesh_shape=(4,)))(tiny_setup())
    with pytest.raises(ValueError, match="needs 4 devices, and this runtime has 1"):
        with xp.session(setup):
            pass
    assert not xr.is_spmd()  # the irreversible switch was not thrown


def test_resolves_minus_one_against_the_device_count():
    plan = SpmdPlan((2, -1), ("data", "model"), "data")
    assert plan.resolved_shape(8) == (2, 4)
    with pytest.raises(ValueError, match="not a multiple of 2"):
        plan.resolved_shape(3)


# -- four devices, in a fresh process ------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    sys.path.insert(0, {here!r})
    import torch_xla, torch_xla.runtime as xr
    import xlapipe as xp
    from xlapipe import checkpoint
    from xlapipe.transforms import shard_data
    from helpers import tiny_setup, loss_fn
    spec = torch_xla._XLAC._get_xla_sharding_spec
    base = xp.Pipeline(xp.with_device(), xp.wrap_loader_mp())
    variants = {{
        "replicate": shard_data(),
        "shard": shard_data(model="shard"),
        "2d": shard_data(mesh_shape=(2, 2), axis_names=("data", "model"), model="shard",
                         shard_axis="model"),
    }}

    def epochs(run, n):
        losses, batches = [], []
        for _ in range(n):
            for batch in run.loaders["train"]:
                batches.append([spec(v) for v in batch])
                losses.append(float(run.step(batch, loss_fn)))
        return losses, batches

    out = {{"devices": xr.global_runtime_device_count()}}
    for name, t in variants.items():
        with xp.session(base.add(t)(tiny_setup())) as run:
            params = {{n: spec(p) for n, p in run.model.named_parameters()}}
            losses, batches = epochs(run, 2)
            after = {{n: spec(p) for n, p in run.model.named_parameters()}}
        out[name] = dict(losses=losses, params=params, after=after, batch=batches[0])
    out["spmd"] = xr.is_spmd()

    # A checkpoint of a sharded run restores into a sharded run.
    path = tempfile.mkdtemp() + "/ckpt.pt"
    with xp.session(base.add(variants["shard"])(tiny_setup())) as run:
        first, _ = epochs(run, 1)
        checkpoint.save(path, run, step=4)
    with xp.session(base.add(variants["shard"])(tiny_setup(seed=3))) as run:
        checkpoint.restore(path, run)
        restored = {{n: spec(p) for n, p in run.model.named_parameters()}}
        second, _ = epochs(run, 1)
    out["resumed"] = dict(losses=first + second, params=restored)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def four_devices() -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(here=HERE)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def single_device() -> list[float]:
    return train_losses(SPMD(tiny_setup()), epochs=2)


@pytest.mark.parametrize("variant", ["replicate", "shard", "2d"])
def test_training_matches_one_device(four_devices, single_device, variant):
    got = four_devices[variant]["losses"]
    assert four_devices["devices"] == 4 and len(got) == len(single_device) == 8
    # The same sums in another order (partial sums per device): float32 rounding only.
    for g, w in zip(got, single_device):
        assert abs(g - w) <= 1e-5 * abs(w), (variant, got, single_device)


def test_batches_are_split_along_the_batch_axis(four_devices):
    assert four_devices["replicate"]["batch"] == ["{devices=[4,1]0,1,2,3}", "{devices=[4]0,1,2,3}"]
    # On a 2 x 2 mesh: inputs split in two along "data", replicated along "model";
    # 1-D labels go up replicated (torch_xla 2.9 cannot upload them partially replicated).
    assert four_devices["2d"]["batch"] == ["{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", "{replicated}"]


def test_model_is_replicated_or_sharded_as_asked(four_devices):
    replicated = four_devices["replicate"]["params"]
    assert set(replicated.values()) == {"{replicated}"}
    sharded = four_devices["shard"]["params"]
    assert sharded["0.weight"] == "{devices=[4,1]0,1,2,3}"  # 16 rows over 4 devices
    assert sharded["0.bias"] == "{devices=[4]0,1,2,3}"
    assert sharded["2.weight"] == "{replicated}"  # 2 rows do not split 4 ways
    assert four_devices["2d"]["params"]["2.weight"] == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    for variant in ("replicate", "shard", "2d"):  # the optimizer's updates keep the layout
        assert four_devices[variant]["after"] == four_devices[variant]["params"]
    assert four_devices["spmd"] is True


def test_checkpoint_of_a_sharded_run_resumes_sharded(four_devices):
    resumed = four_devices["resumed"]
    assert resumed["params"] == four_devices["shard"]["params"]
    for g, w in zip(resumed["losses"], four_devices["shard"]["losses"]):
        assert abs(g - w) <= 1e-6 * abs(w)
