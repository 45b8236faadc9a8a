"""A function target with known timings, for testing the runner's loops (it trains nothing).

``train(pipeline, times={...})``: the report's ``epoch_s`` is ``times[name]`` for
the first listed transform name the pipeline holds (``times[""]`` for the
empty pipeline), times a random factor of ``1 ± noise``; the run takes
``sleep`` seconds of wall time.
"""

from __future__ import annotations

import random
import time

import xlapipe as xp


def train(
    pipeline: xp.Pipeline,
    times: dict[str, float],
    noise: float = 0.0,
    sleep: float = 0.0,
    loss: float = 0.5,
    metric: float = 0.75,
) -> dict:
    base = next((t for name, t in times.items() if name and name in pipeline), times.get("", 1.0))
    time.sleep(sleep)
    value = base * (1 + random.uniform(-noise, noise))
    return {
        "epoch_s": value,
        "steps_per_s": 10 / value,
        "final_loss": loss,
        "metric": metric,
        "metric_name": "accuracy",
        "first_update_s": value / 2,
        "eval_s": value / 10,
        "metric_history": [[value, metric]],
    }
