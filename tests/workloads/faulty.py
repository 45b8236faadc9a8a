"""A function target that fails or hangs on demand: for testing the ablation runner."""
from __future__ import annotations

import time

import xlapipe as xp
from tiny_mlp import train as tiny_train


def train(pipeline: xp.Pipeline, fail_if: str | None = None, hang_if: str | None = None, **kwargs) -> dict:
    """``tiny_mlp.train``, except: raise when ``fail_if`` is in the pipeline, hang when ``hang_if`` is."""
    if fail_if is not None and fail_if in pipeline:
        raise RuntimeError(f"deliberate failure: {fail_if} is in the pipeline")
    if hang_if is not None and hang_if in pipeline:
        time.sleep(3600)
    return tiny_train(pipeline, **kwargs)
