"""A function target that fails, hangs or crashes on demand: for testing the ablation runner."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tiny_mlp import train as tiny_train

import xlapipe as xp


def train(
    pipeline: xp.Pipeline,
    fail_if: str | None = None,
    hang_if: str | None = None,
    crash_if: str | None = None,
    **kwargs,
) -> dict:
    """``tiny_mlp.train``, except: raise when ``fail_if`` is in the pipeline, hang when ``hang_if`` is
    (with a child process of its own, which must not outlive the run), die of SIGSEGV when ``crash_if`` is."""
    if fail_if is not None and fail_if in pipeline:
        raise RuntimeError(f"deliberate failure: {fail_if} is in the pipeline")
    if crash_if is not None and crash_if in pipeline:
        os.kill(os.getpid(), signal.SIGSEGV)
    if hang_if is not None and hang_if in pipeline:
        subprocess.Popen(["sleep", "3600"])
        print("hanging", flush=True)
        time.sleep(3600)
    return tiny_train(pipeline, **kwargs)
