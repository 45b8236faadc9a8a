"""A function target that fails on its first run and succeeds on the next: for testing retries."""

from __future__ import annotations

import os

from tiny_mlp import train as tiny_train

import xlapipe as xp


def train(pipeline: xp.Pipeline, marker: str, **kwargs) -> dict:
    """``tiny_mlp.train``, except that the first call (``marker`` does not exist yet) raises."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("deliberate failure on the first run")
    return tiny_train(pipeline, **kwargs)
