"""The ablation on a Ray cluster against this machine alone: what a run costs to dispatch, what N machines buy.

    .venv/bin/python -m bench.fleet [--sleep 3] [--rounds 3] [--out results/fleet]

Three ablations of the same sleeping runs (tests/workloads/fleet_target.py as
a contract script: 2 variants, ``--rounds`` rounds, each run sleeping
``--sleep`` s and importing nothing heavy), one after the other in this
process: on this machine (a fresh interpreter per run), on a fake Ray cluster of one
node, and on one of three nodes (``ray.cluster_utils.Cluster``, 127.0.0.1
only). Reported: the wall time of each, the dispatch cost per run (one node
against this machine) and the speed-up of three nodes (against this machine;
at most 3 with rounds a multiple of 3). Repeated ``--repeats`` times, the
median kept. The cluster's start-up is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, before ray is imported

from tests.workloads.fleet_target import FAKE_NODE as NODE  # noqa: E402
from tests.workloads.fleet_target import VARIANTS  # noqa: E402

SCRIPT = str(Path(__file__).resolve().parent.parent / "tests" / "workloads" / "fleet_target.py")


def one(sleep: float, rounds: int, ray_address: str | None) -> float:
    """Wall seconds of one ablation of the sleeping script."""
    from xlapipe.ablation import Judging, Output, Runs, Variants, ablate

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        ablate(
            SCRIPT,
            ["--sleep", str(sleep)],
            variants=Variants(mode="explicit", explicit=VARIANTS),
            judging=Judging(repeats=rounds, until_resolved=False),
            runs=Runs(contract=True, ray=ray_address),
            output=Output(out, progress=False, echo=None),
        )
        return time.perf_counter() - start


def on_cluster(nodes: int, sleep: float, rounds: int, repeats: int) -> list[float]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=NODE)
    for _ in range(nodes - 1):
        cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        return [one(sleep, rounds, cluster.address) for _ in range(repeats)]
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleep", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/fleet")
    opts = parser.parse_args()
    runs = 2 * opts.rounds
    local = [one(opts.sleep, opts.rounds, None) for _ in range(opts.repeats)]
    ray1 = on_cluster(1, opts.sleep, opts.rounds, opts.repeats)
    ray3 = on_cluster(3, opts.sleep, opts.rounds, opts.repeats)
    med = {k: statistics.median(v) for k, v in {"local": local, "ray1": ray1, "ray3": ray3}.items()}
    result = {
        "machine": f"{os.cpu_count()} CPU cores",
        "sleep_s": opts.sleep,
        "runs": runs,
        "wall_s": {"local": local, "ray_1_node": ray1, "ray_3_nodes": ray3},
        "dispatch_s_per_run": (med["ray1"] - med["local"]) / runs,
        "speedup_3_nodes": med["local"] / med["ray3"],
    }
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    (Path(opts.out) / "fleet.json").write_text(json.dumps(result, indent=1))
    print(
        f"{runs} runs of {opts.sleep:g} s, median of {opts.repeats}: this machine {med['local']:.1f} s, "
        f"Ray 1 node {med['ray1']:.1f} s ({result['dispatch_s_per_run']:+.2f} s per run), "
        f"Ray 3 nodes {med['ray3']:.1f} s ({result['speedup_3_nodes']:.2f}x this machine; at least 1.8x asked)"
    )


if __name__ == "__main__":
    main()
