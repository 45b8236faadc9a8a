"""A workload for the fleet tests: a planted effect, a planted slow machine, no device work.

As a function target (``fleet_target.py:train``) or a script that follows the
workload contract (``--print-pipeline``, ``--pipeline``, ``--report``; it imports
neither torch nor xlapipe, so a run starts at once), it reports an ``epoch_s``
of 10 s, times 0.7 when the pipeline has ``wrap_loader_mp``, times 2 on the
machine ``slow_node`` (the run's ``XLAPIPE_MACHINE``), with 0.3% noise; it
sleeps ``sleep`` seconds first, so a test can lose a machine during a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

# A fake TPU host of ray.cluster_utils.Cluster (tests/test_fleet.py, bench/fleet.py): 4 TPU as a v4
# host has, one CPU, no dashboard, a small object store, loopback only.
FAKE_NODE = {
    "num_cpus": 1,
    "resources": {"TPU": 4},
    "include_dashboard": False,
    "object_store_memory": 80 * 2**20,
    "node_ip_address": "127.0.0.1",
}
# Two variants as explicit pipelines: the reference, and one with the planted 0.7x effect.
VARIANTS = [
    {"name": "reference", "pipeline": [{"name": "with_device"}]},
    {"name": "loader", "pipeline": [{"name": "with_device"}, {"name": "wrap_loader_mp"}]},
]


def figures(names: list[str], slow_node: str = "", sleep: float = 0.0) -> dict[str, Any]:
    time.sleep(sleep)
    seconds = 10.0 * (0.7 if "wrap_loader_mp" in names else 1.0)
    seconds *= 2.0 if os.environ.get("XLAPIPE_MACHINE") == slow_node else 1.0
    seconds *= 1 + random.uniform(-0.003, 0.003)
    return {"epoch_s": seconds, "final_loss": 0.5, "machine": os.environ.get("XLAPIPE_MACHINE", "")}


def train(pipeline: Any, slow_node: str = "", sleep: float = 0.0) -> dict[str, Any]:
    """The function target: ``pipeline`` is an ``xlapipe.Pipeline``."""
    return figures(list(pipeline.names), slow_node, sleep)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--print-pipeline", action="store_true")
    parser.add_argument("--pipeline", default="[]")
    parser.add_argument("--report")
    parser.add_argument("--slow-node", default="")
    parser.add_argument("--sleep", type=float, default=0.0)
    opts = parser.parse_args()
    if opts.print_pipeline:
        print(json.dumps([{"name": "with_device"}, {"name": "wrap_loader_mp"}]))
        sys.exit(0)
    names = [t["name"] for t in json.loads(opts.pipeline)]
    with open(opts.report, "w") as f:
        json.dump(figures(names, opts.slow_node, opts.sleep), f)
