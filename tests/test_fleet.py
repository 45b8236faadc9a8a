"""The ablation on a Ray cluster: three fake TPU machines on this one, loopback only (docs/scale-out.md).

Each node of ``ray.cluster_utils.Cluster`` registers 4 ``TPU`` (what a v4 host
has) and takes one run at a time. The target (tests/workloads/fleet_target.py,
a contract script that imports nothing heavy, or the same as a function) has a
planted effect (``wrap_loader_mp``: 0.7x) and a planted slow machine (2x on one
node), so a comparison that mixed machines would see noise or a false effect.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = (
    "0"  # before ray is imported: 127.0.0.1, never the host's address
)
ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (pip install 'xlapipe[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from workloads.fleet_target import FAKE_NODE  # noqa: E402
from workloads.fleet_target import VARIANTS as LOADER_AND_REFERENCE  # noqa: E402
from xlapipe.ablation import Judging, Output, Runs, Variants, ablate  # noqa: E402
from xlapipe.ablation import results as store  # noqa: E402
from xlapipe.ablation.results import Results  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")  # one worker starts the one cluster (make test: --dist loadgroup)

HERE = Path(__file__).parent
SCRIPT = str(HERE / "workloads" / "fleet_target.py")  # runs in a moment: no torch
TARGET = f"{SCRIPT}:train"  # a run imports xlapipe and torch
NODE = FAKE_NODE
VARIANTS = [
    *LOADER_AND_REFERENCE,
    {"name": "same", "pipeline": [{"name": "with_device"}, {"name": "wrap_model_mp"}]},
]


FAST_FAILURE = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}  # a lost node: in 2 s


@pytest.fixture(scope="module")
def cluster():
    head = {**NODE, "resources": {"TPU": 4, "TPU-v4-8-head": 1}, "_system_config": FAST_FAILURE}
    c = Cluster(initialize_head=True, head_node_args=head)
    workers = [c.add_node(**NODE) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c, workers
    ray.shutdown()
    c.shutdown()


def _nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


def _ablate(
    out: Path, address: str, target=SCRIPT, args=None, variants=VARIANTS, repeats=3, imports=(), **kwargs
) -> Results:
    judging = Judging(repeats=repeats, until_resolved=False)
    return ablate(
        target,
        {} if args is None else args,
        variants=Variants(mode="explicit", explicit=variants, imports=imports),
        judging=judging,
        runs=Runs(ray=address, **kwargs),
        output=Output(out, progress=False, echo=None),
    )


def test_verdicts_are_right_and_a_slow_machine_does_not_bias_them(cluster, tmp_path):
    c, _ = cluster
    slow = _nodes()[0]
    res = _ablate(tmp_path, c.address, args=["--slow-node", slow], contract=True)
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # loopback only
    records = [r for r in store.load(tmp_path / store.RESULTS_FILE) if r["status"] == "ok"]
    assert len(records) == 9
    machines = {r["machine"]["node"] for r in records}
    assert len(machines) == 3 and slow in machines  # the rounds went to every machine
    for r in records:  # the run really ran where its record says
        assert r["report"]["machine"] == r["machine"]["node"] and r["machine"]["host"]
    per_round = {}
    for r in records:
        per_round.setdefault(r["repeat"], set()).add(r["machine"]["node"])
    assert all(len(m) == 1 for m in per_round.values()), per_round  # a round is one block
    verdicts = {s.variant.name: s for s in res.analysis().summaries}
    assert 1.38 < verdicts["loader"].interval.low < verdicts["loader"].interval.high < 1.48  # 1 / 0.7: faster
    assert verdicts["same"].interval.low > 0.95 and verdicts["same"].interval.high < 1.05
    said = res.table()
    shown = re.search(rf"/{slow[:12]} ([0-9.]+)x", said)
    assert shown and "Outlier(s)" in said, said
    assert abs(float(shown[1]) - 2 / 2 ** (1 / 3)) < 0.015, said  # 2x against the geometric mean; 0.3% noise


def test_a_function_target_runs_on_the_machines_too(cluster, tmp_path):
    c, _ = cluster
    _ablate(tmp_path, c.address, TARGET, {"slow_node": "none"}, VARIANTS[:2], repeats=1)
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("error") for r in records]
    assert {r["report"]["machine"] for r in records} == {
        records[0]["machine"]["node"]
    }  # one round: one machine
    assert records[0]["kind"] == "function"


def test_import_modules_reach_the_runs_on_the_machines_and_are_checked_on_each(
    cluster, tmp_path, monkeypatch
):
    c, _ = cluster
    monkeypatch.chdir(HERE / "workloads")  # my_practice.py is here; tiny_mlp never imports it
    mine = [{"name": "count_steps", "params": {"label": "mine"}}]
    _ablate(
        tmp_path,
        c.address,
        "tiny_mlp:train",
        {"max_steps": 8, "warmup": 2, "train_size": 128},
        [{"name": "mine", "pipeline": mine}],
        repeats=1,
        imports=["my_practice"],
        warmup=2,
    )
    records = store.load(tmp_path / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["ok"], [r["error"][-800:] for r in records]
    assert records[0]["machine"]["node"] and "my_practice" in records[0]["command"]
    assert any("mine: a step" in p.read_text() for p in tmp_path.rglob("*.log"))
    from xlapipe.ablation import on_node

    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    for folder in (here, elsewhere):
        folder.mkdir()
    (here / "practices_only_here.py").write_text("")  # a module name no other test puts on sys.path
    assert on_node.check_here([], str(here), ["practices_only_here", "json.decoder", "sys"])["missing"] == []
    missing = on_node.check_here([], str(elsewhere), ["practices_only_here", "no_such_practices"])["missing"]
    assert missing == [
        f"module {m!r} (--import) from {elsewhere}" for m in ("practices_only_here", "no_such_practices")
    ]
    from xlapipe.ablation.fleet import RayFleet
    from xlapipe.ablation.target import Target

    fleet = RayFleet(
        c.address, None, Target("tiny_mlp:train", "function", imports=("no_such_practices",)), {}
    )
    with pytest.raises(
        RuntimeError, match=r"cannot run the target(.|\n)*no module 'no_such_practices' \(--import\)"
    ):
        fleet.connect()  # every machine is asked, before any run


def test_a_machine_lost_mid_round_loses_no_run(cluster, tmp_path):
    c, workers = cluster
    done: list[object] = []
    args = ["--sleep", "2"]
    run = lambda: done.append(_ablate(tmp_path, c.address, SCRIPT, args, VARIANTS[:2], contract=True))  # noqa: E731
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    path = tmp_path / store.RESULTS_FILE
    deadline = time.monotonic() + 240
    while not (path.exists() and store.load(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    c.remove_node(workers[-1])  # every machine is in the middle of its round
    worker.join(timeout=300)
    assert done, "the ablation finished"
    records = store.load(path)
    lost = [r for r in records if r["status"] == "lost"]
    assert lost, "a run was in flight on the machine removed"
    ok = [store.record_key(r) for r in records if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 6  # every run once, none twice
    for r in lost:
        again = [x for x in records if store.record_key(x) == store.record_key(r) and x["status"] == "ok"]
        assert again and again[0]["attempt"] == 2 and again[0]["machine"]["node"] != r["machine"]["node"]
        assert again[0]["log"] != r["log"] and "run again on another machine" in Path(r["log"]).read_text()


def test_a_killed_driver_resumes_with_what_is_missing(cluster, tmp_path):
    c, _ = cluster
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).parent / "xlapipe"), "ablate", SCRIPT, "--ray", c.address]
    cmd += ["--out", str(out), "--mode", "explicit", "--variants", json.dumps(VARIANTS[:2])]
    cmd += ["--repeats", "3", "--no-until-resolved", "--contract", "--no-progress"]
    script_args = ["--", "--sleep", "2"]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    first = subprocess.Popen(
        [*cmd, *script_args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    path = out / store.RESULTS_FILE
    deadline = time.monotonic() + 240
    while not (path.exists() and store.load(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    before = [r for r in store.load(path) if r["status"] == "ok"]
    assert 0 < len(before) < 6, len(before)
    second = subprocess.run(
        [*cmd, "--resume", *script_args], env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"{len(before)} already recorded" in second.stdout
    ok = [store.record_key(r) for r in store.load(path) if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 6


def test_what_cannot_run_is_refused_before_any_run(cluster, tmp_path):
    c, _ = cluster
    with pytest.raises(ConnectionError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        from xlapipe.ablation.fleet import check_reachable

        check_reachable("127.0.0.1:1")
    with pytest.raises(
        RuntimeError,
        match=r"no machine .* has the resources \{'TPU-v9-head': 1.0\} \(its nodes have: .*TPU 4",
    ):
        _ablate(tmp_path / "a", c.address, SCRIPT, [], contract=True, ray_resources={"TPU-v9-head": 1})
    assert not (tmp_path / "a" / store.RESULTS_FILE).exists()
    from xlapipe.ablation.fleet import RayFleet
    from xlapipe.ablation.target import Target

    fleet = RayFleet(c.address, None, Target(str(tmp_path / "gone.py"), "script"), {})
    with pytest.raises(RuntimeError, match=r"cannot run the target(.|\n)*no .*gone\.py"):
        fleet.connect()


def test_without_ray_the_flag_fails_at_once_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'xlapipe\[ray\]'"):
        _ablate(tmp_path, "auto", SCRIPT, [], contract=True)
