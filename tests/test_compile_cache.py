"""with_compile_cache: honest on CPU (a warning, nothing done); the TPU path's mechanics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import xlapipe as xp
from helpers import tiny_setup
from xlapipe.transforms.compile_cache import PATH_VAR, CompileCacheWarning, with_compile_cache

HERE = os.path.dirname(os.path.abspath(__file__))


def test_is_a_value_that_needs_the_device():
    t = with_compile_cache("/tmp/cache", readonly=True)
    assert xp.rebuild(t.name, t.describe()["params"]) == t
    assert t.needs == {"with_device"}
    with pytest.raises(xp.OrderError, match="with_compile_cache needs with_device"):
        xp.Pipeline(t)


def test_on_cpu_it_warns_and_does_nothing(tmp_path):
    cache = tmp_path / "cache"
    setup = xp.Pipeline(xp.with_device(), with_compile_cache(str(cache)))(tiny_setup())
    env = dict(os.environ)
    with pytest.warns(CompileCacheWarning, match="cannot read it back"):
        with xp.session(setup) as run:
            assert PATH_VAR not in os.environ
            for batch in run.loaders["train"]:
                run.step(batch, lambda m, b: m(b[0].to(run.device)).sum())
                break
    assert not cache.exists()
    assert dict(os.environ) == env


# In a fresh process (the cache must be chosen before the first compile), with
# the CPU refusal switched off: what the transform does on TPU, and why it
# refuses on CPU (torch_xla cannot deserialize CPU executables).
TPU_PATH = textwrap.dedent("""
    import json, os, sys, warnings
    sys.path.insert(0, {here!r})
    import torch_xla.debug.metrics as met
    import xlapipe as xp
    from xlapipe.transforms import compile_cache
    from helpers import tiny_setup, train_losses
    compile_cache.UNSUPPORTED = ()  # behave as on TPU
    path = sys.argv[1]
    pipeline = xp.Pipeline(xp.with_device(), compile_cache.with_compile_cache(path))
    out = {{}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xp.session(pipeline(tiny_setup())) as run:
            out["env_in_session"] = os.environ.get(compile_cache.PATH_VAR)
        out["env_after"] = os.environ.get(compile_cache.PATH_VAR)
        out["losses"] = train_losses(pipeline(tiny_setup()))  # same path again: fine
    out["files"] = len(os.listdir(path))
    out["deserialize_failures"] = met.counter_value("PersistentCacheDeserializeFailure") or 0
    other = xp.Pipeline(xp.with_device(), compile_cache.with_compile_cache(path + "-other"))
    try:
        xp.session(other(tiny_setup())).__enter__()
    except RuntimeError as error:
        out["other_path"] = str(error)
    print(json.dumps(out))
""")


def run_tpu_path(path: str) -> dict:
    script = TPU_PATH.format(here=HERE)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, path], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tpu_path_writes_the_cache_and_cpu_cannot_read_it(tmp_path):
    path = str(tmp_path / "cache")
    first = run_tpu_path(path)
    assert first["env_in_session"] == first["env_after"] == path  # for the process, like use_spmd
    assert first["files"] > 0  # executables written
    assert "already started its compile cache" in first["other_path"]
    assert first["deserialize_failures"] == 0
    second = run_tpu_path(path)
    # The reason with_compile_cache refuses on CPU; if this starts failing,
    # torch_xla reads CPU executables back and the refusal should go.
    assert second["deserialize_failures"] > 0
    assert second["losses"] == first["losses"]
