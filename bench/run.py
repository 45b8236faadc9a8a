"""The benchmark suite: xlapipe against its peers on identical work, side by side.

    python -m bench.run --size full --out results/bench     # the figures for docs
    python -m bench.run --size modest --out results/bench   # a quick look (one repeat)
    python -m bench.run --size smoke --out /tmp/bench       # toy models, checks the plumbing

Every (workload, peer) run is a fresh subprocess (``bench.peers``,
``bench.memory``, ``bench.overhead``); repeats are interleaved (repeat r runs
every peer once, in an order rotated by r) so slow drifts of a shared machine
hit all peers alike. Writes ``results.json`` (every run, the summary, the
targets) and ``results.md`` (the tables) to ``--out``, with each run's log
under ``logs/``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any

import attrs

from xlapipe import child_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PEERS = {
    "bert": (
        "xlapipe",
        "xlapipe-no-hf-masks",
        "xlapipe+compile",
        "xlapipe+xla_compile",
        "accelerate",
        "torch_xla",
        "eager",
    ),
    "varlen": ("xlapipe", "accelerate", "xlapipe-no-static"),
    "hostbound": (
        "xlapipe",
        "xlapipe+compile",
        "xlapipe+compile_fwd",
        "xlapipe+xla_compile",
        "xlapipe+bpe4",
        "xlapipe+acc4",
        "xlapipe+acc4+bpe4",
        "torch_xla",
        "accelerate",
        "eager",
    ),
    "memory": ("replica_builds", "wrap_model_mp", "parent_builds"),
    "overhead": ("xlapipe",),
}
WORKLOADS = tuple(PEERS)

# (warmup, measured steps) per workload (hostbound's warm-up a multiple of 4, so +acc4/+bpe4
# windows line up with the measured steps); memory: (model, replicas); overhead: repeats.
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "bert": (3, 3),
        "varlen": (3, 5),
        "hostbound": (4, 20),
        "memory": ("tiny", 2),
        "overhead": 20,
        "repeats": 1,
    },
    "modest": {
        "bert": (3, 12),
        "varlen": (3, 13),
        "hostbound": (4, 300),
        "memory": ("base", 4),
        "overhead": 200,
        "repeats": 1,
    },
    "full": {
        "bert": (3, 30),
        "varlen": (3, 37),
        "hostbound": (12, 1000),
        "memory": ("base", 4),
        "overhead": 1000,
        "repeats": 3,
    },
}

DESCRIPTIONS = {
    "bert": "the NLP example's BERT (small: 4 layers, hidden 256, vocab 28996) on its MRPC-shaped pairs, "
    "every batch padded to 128, batch 16, AdamW (lr 3e-4, no schedule), fp32",
    "varlen": "the same BERT, pairs of 20 to 110 tokens; xlapipe pads to 128 (static_shapes), "
    "the others pad to the longest item of each batch (Accelerate's nlp_example collate off TPU); "
    "one epoch, compiles included",
    "hostbound": "eight Linear(64, 64) with ReLU, batch 16, AdamW(1e-3), cross-entropy over 64 classes",
    "memory": "forked replicas of the NLP example's BERT at size base (bert-base, 108M parameters), "
    "CPU_NUM_DEVICES=1 each; total PSS of parent + replicas",
    "overhead": "Pipeline(eight transforms) built and applied to a TrainingSetup of the small BERT "
    "(87 modules); no device work",
}


# -- running -------------------------------------------------------------------------------


def command(workload: str, peer: str, size: str, path: str) -> list[str]:
    spec = SIZES[size]
    if workload == "memory":
        model, replicas = spec["memory"]
        return [
            sys.executable,
            "-m",
            "bench.memory",
            "--config",
            peer,
            "--replicas",
            str(replicas),
            "--model",
            model,
            "--out",
            path,
        ]
    if workload == "overhead":
        return [
            sys.executable,
            "-m",
            "bench.overhead",
            "--repeats",
            str(spec["overhead"]),
            "--out",
            path,
            *(["--smoke"] if size == "smoke" else []),
        ]
    warmup, steps = spec[workload]
    return [
        sys.executable,
        "-m",
        "bench.peers",
        "--workload",
        workload,
        "--peer",
        peer,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--out",
        path,
        *(["--smoke"] if size == "smoke" else []),
    ]


def run_one(workload: str, peer: str, size: str, repeat: int, out: str, timeout: float) -> dict:
    """One fresh process; its report, or a record of why there is none."""
    safe = peer.replace("+", "_")
    path = os.path.join(out, "runs", f"{workload}-{safe}-r{repeat}.json")
    log = os.path.join(out, "logs", f"{workload}-{safe}-r{repeat}.log")
    cmd = command(workload, peer, size, path)
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU" if not _tpu() else "TPU")
    env["CPU_NUM_DEVICES"] = "1"
    start = time.perf_counter()
    done = child_process.run(cmd, log=log, env=env, cwd=REPO, limit=timeout, result=path)
    record: dict[str, Any] = {
        "workload": workload,
        "peer": peer,
        "repeat": repeat,
        "process_s": time.perf_counter() - start,
        "command": shlex.join(cmd[1:]),
    }
    if done.status == "ended" and done.result is not None:
        record.update(done.result)
        record["status"] = "ok"
    else:
        code = "timeout" if done.status == "timeout" else done.returncode
        record["status"] = "skipped" if code == 3 else "failed"
        record["error"] = f"exit {code}: " + " | ".join(
            line.strip() for line in done.tail().splitlines()[-6:]
        )
    return record


def _tpu() -> bool:
    sys.path.insert(0, REPO)
    from xlapipe import runtime

    return runtime.tpu_present()


# -- summarising ----------------------------------------------------------------------------


def _stats(values: list[float | None]) -> dict[str, float] | None:
    """Median, min, max, quartiles and count of the finite ``values`` (as the ablation reports them)."""
    from xlapipe.ablation.stats import Stats

    stats = Stats.of(values)
    return None if stats is None else attrs.asdict(stats)


def _ratios(runs: list[dict], num: str, den: str, key: str | tuple[str, str]) -> list[float]:
    """Per repeat, ``num``'s ``key`` over ``den``'s (runs of one workload, paired by repeat)."""

    def get(r: dict) -> Any:
        return r[key[0]][key[1]] if isinstance(key, tuple) else r.get(key)

    by = {(r["peer"], r["repeat"]): r for r in runs if r["status"] == "ok"}
    out = []
    for (peer, rep), r in sorted(by.items()):
        other = by.get((den, rep))
        if peer == num and other is not None and get(r) and get(other):
            out.append(get(r) / get(other))
    return out


def _loss_diff(a: list[float], b: list[float]) -> float | None:
    if not a or len(a) != len(b):
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def replicas_only(run: dict) -> dict:
    """A memory run with ``replicas_pss_mb``: the replicas' PSS per phase, the parent's share left out."""
    if run.get("workload") != "memory" or run.get("status") != "ok" or "phases" not in run:
        return run
    return {
        **run,
        "replicas_pss_mb": {
            phase: sum(p["Pss"] for name, p in figures["processes"].items() if name != "parent")
            for phase, figures in run["phases"].items()
        },
    }


def summarise(runs: list[dict]) -> dict:
    """Medians and spread per (workload, peer), ratios against xlapipe."""
    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        mine = [r for r in runs if r["workload"] == workload]
        if not mine:
            continue
        table = {}
        for peer in PEERS[workload]:
            rs = [r for r in mine if r["peer"] == peer]
            if not rs:
                continue
            ok = [r for r in rs if r["status"] == "ok"]
            row: dict[str, Any] = {
                "runs": len(rs),
                "ok": len(ok),
                "errors": [r["error"] for r in rs if r["status"] != "ok"],
            }
            if workload == "memory":
                for phase in ("runtime", "host", "realised"):
                    row[f"pss_{phase}_mb"] = _stats([r["total_pss_mb"][phase] for r in ok])
                row["device_copies_mb"] = ok[0]["device_copies_mb"] if ok else None
                row["pipeline"] = ok[0]["pipeline"] if ok else None
            elif workload == "overhead":
                for part in ("build", "apply", "total"):
                    row[f"{part}_ms"] = _stats([r[part]["median_ms"] for r in ok])
                row["pipeline"] = ok[0]["pipeline"] if ok else None
            else:
                for key in (
                    "steps_per_s",
                    "epoch_s",
                    "compiles_after_warmup",
                    "compiles_total",
                    "wall_over_execute",
                    "execute_s_after_warmup",
                    "wall_s",
                    "executions_per_step",
                    "step_ms",
                    "next_batch_ms",
                    "peak_rss_mb",
                    "final_loss",
                    "first_update_s",
                    "compile_s_total",
                ):
                    row[key] = _stats([r.get(key) for r in ok])
                row["xlapipe_over_peer_steps_per_s"] = _stats(_ratios(mine, "xlapipe", peer, "steps_per_s"))
                row["peer_over_xlapipe_epoch_s"] = _stats(_ratios(mine, peer, "xlapipe", "epoch_s"))
                base = {r["repeat"]: r for r in mine if r["peer"] == "xlapipe" and r["status"] == "ok"}
                for label, n in (("", None), ("_first100", 100)):
                    diffs = [
                        _loss_diff(r["losses"][:n], base[r["repeat"]]["losses"][:n])
                        for r in ok
                        if r["repeat"] in base
                    ]
                    row[f"loss_max_rel_diff_vs_xlapipe{label}"] = max(
                        (d for d in diffs if d is not None), default=None
                    )
                row["loop"] = ok[0]["loop"] if ok else None
            table[peer] = row
        out[workload] = table
    if "memory" in out:
        mem = [replicas_only(r) for r in runs if r["workload"] == "memory"]
        for peer, row in out["memory"].items():
            for phase in ("host", "realised"):
                row[f"ratio_vs_replica_builds_{phase}"] = _stats(
                    _ratios(mem, peer, "replica_builds", ("total_pss_mb", phase))
                )
            row["replicas_ratio_vs_replica_builds_host"] = _stats(
                _ratios(mem, peer, "replica_builds", ("replicas_pss_mb", "host"))
            )
    return out


def targets(summary: dict, runs: list[dict]) -> list[dict]:
    """The issue's targets, each with what was measured (median over repeats) and whether it is met."""
    rows = []

    def add(name: str, stats: dict | None, goal: str, ok: Any, note: str = "") -> None:
        rows.append(
            {
                "target": name,
                "measured": stats,
                "goal": goal,
                "met": None if stats is None else bool(ok(stats["median"])),
                "note": note,
            }
        )

    if "bert" in summary:
        b = summary["bert"]
        add(
            "bert: xlapipe steps/s / Accelerate steps/s",
            b.get("accelerate", {}).get("xlapipe_over_peer_steps_per_s"),
            ">= 1.00",
            lambda v: v >= 1.00,
        )
        add(
            "bert: xlapipe steps/s / hand-written torch_xla loop",
            b.get("torch_xla", {}).get("xlapipe_over_peer_steps_per_s"),
            ">= 0.98",
            lambda v: v >= 0.98,
        )
        add(
            "bert: xlapipe wall / XLA execute time",
            b.get("xlapipe", {}).get("wall_over_execute"),
            "<= 1.03",
            lambda v: v <= 1.03,
            "on the CPU runtime the host's tracing (host ms in step()) is not hidden behind the "
            "device's execution: wall time is about tracing plus execution; see bench/README.md",
        )
    if "varlen" in summary:
        v = summary["varlen"]
        add(
            "varlen: Accelerate epoch time / xlapipe epoch time",
            v.get("accelerate", {}).get("peer_over_xlapipe_epoch_s"),
            ">= 2.5",
            lambda x: x >= 2.5,
        )
        compiles = v.get("xlapipe", {}).get("compiles_after_warmup")
        add(
            "varlen: xlapipe compilations after warm-up (max over repeats)",
            None if compiles is None else {**compiles, "median": compiles["max"]},
            "== 0",
            lambda x: x == 0,
        )
    if "hostbound" in summary:
        h = summary["hostbound"]
        hb = [r for r in runs if r["workload"] == "hostbound"]
        add(
            "hostbound: compile_step steps/s / lazily traced xlapipe",
            _stats(_ratios(hb, "xlapipe+compile", "xlapipe", "steps_per_s")),
            ">= 1.4",
            lambda x: x >= 1.4,
        )
        for label, suffix, note in (
            ("first 100 steps", "_first100", ""),
            (
                "all steps",
                "",
                "rounding differences of the compiled AdamW update compound over "
                "training; with the update left lazy (compile_fwd) the losses are bit-identical",
            ),
        ):
            diff = h.get("xlapipe+compile", {}).get(f"loss_max_rel_diff_vs_xlapipe{suffix}")
            add(
                f"hostbound: compiled losses vs lazy, max relative difference ({label})",
                None if diff is None else {"median": diff, "min": diff, "max": diff, "n": 1},
                "<= 1e-5",
                lambda x: x <= 1e-5,
                note,
            )
    if "memory" in summary:
        m = summary["memory"]
        add(
            "memory: total PSS with wrap_model_mp / replicas building their own (host copy in place)",
            m.get("wrap_model_mp", {}).get("ratio_vs_replica_builds_host"),
            "<= 0.4",
            lambda x: x <= 0.4,
            "the parent's imports (torch, torch_xla, transformers) are most of it; see bench/README.md",
        )
        add(
            "memory: the same, after realising (CPU: device copies are host memory too)",
            m.get("wrap_model_mp", {}).get("ratio_vs_replica_builds_realised"),
            "<= 0.4",
            lambda x: x <= 0.4,
        )
        add(
            "memory: the same, host copy in place, the four replicas' PSS only (the parent's share left out)",
            m.get("wrap_model_mp", {}).get("replicas_ratio_vs_replica_builds_host"),
            "<= 0.4",
            lambda x: x <= 0.4,
            "the parent's imports (torch, torch_xla, transformers) are shared by "
            "every process; this leaves the parent's 1/5 of them out",
        )
    if "overhead" in summary:
        add(
            "overhead: build + apply a pipeline of eight transforms (ms, median)",
            summary["overhead"].get("xlapipe", {}).get("total_ms"),
            "< 1",
            lambda x: x < 1.0,
            "most of it is wrap_model_mp's shallow copy of the module tree (placement.copy_tree)",
        )
    return rows


# -- reporting ----------------------------------------------------------------------------------


def _fmt(stats: dict | None, digits: int = 2, spread: bool = True) -> str:
    if not stats:
        return "n/a"
    med = stats["median"]
    text = f"{med:.{digits}g}" if abs(med) < 1e-3 and med else f"{med:.{digits}f}"
    if spread and stats.get("n", 1) > 1:
        text += f" ({stats['min']:.{digits}f}–{stats['max']:.{digits}f})"
    return text


def markdown(result: dict) -> str:
    env, summary = result["environment"], result["summary"]
    lines = [
        "# xlapipe against its peers",
        "",
        f"Command: `{result['command']}`  ",
        f"Date: {result['date']}; {env['cpus']} CPUs ({env['machine']}), PJRT_DEVICE={env['pjrt_device']}; "
        f"load average {env['load_before']} before, {env['load_after']} after; "
        f"wall time of the suite {result['suite_s'] / 60:.1f} min.  ",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f"; commit {env['commit']}.  ",
        f"Size `{result['size']}`, {result['repeats']} repeat(s), interleaved; figures are medians "
        "(min–max over repeats). Ratios are paired by repeat.",
        "",
        "## Targets",
        "",
        "| target | measured | goal | met | note |",
        "|---|---|---|---|---|",
    ]
    for t in result["targets"]:
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {_fmt(t['measured'], 3)} | {t['goal']} | {met} | {t['note']} |")
    for workload in ("bert", "varlen", "hostbound"):
        if workload not in summary:
            continue
        lines += [
            "",
            f"## {workload}",
            "",
            DESCRIPTIONS[workload],
            "",
            "| peer | steps/s after warm-up | xlapipe / peer (steps/s) | epoch s | epoch / xlapipe's "
            "| first update s (compile s) "
            "| compiles after warm-up (total) | wall / execute | XLA executions / step "
            "| host ms / step: step() + next() | peak RSS MB | final loss | loss vs xlapipe (max rel) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for peer, row in summary[workload].items():
            if not row["ok"]:
                lines.append(
                    f"| {peer} | {'skipped' if 'exit 3' in ' '.join(row['errors']) else 'failed'}: "
                    f"{(row['errors'] or ['?'])[0][:120]} ||||||||||||"
                )
                continue
            wall = row["wall_over_execute"]
            wall_text = _fmt(wall) if wall else "n/a"
            if peer.startswith("xlapipe+compile"):
                wall_text += " †"
            diff = row["loss_max_rel_diff_vs_xlapipe"]
            lines.append(
                f"| {peer} | {_fmt(row['steps_per_s'])} | {_fmt(row['xlapipe_over_peer_steps_per_s'], 3)} "
                f"| {_fmt(row['epoch_s'], 1)} | {_fmt(row['peer_over_xlapipe_epoch_s'], 2)} "
                f"| {_fmt(row.get('first_update_s'), 2, False)} ({_fmt(row.get('compile_s_total'), 2, False)}) "
                f"| {_fmt(row['compiles_after_warmup'], 0, False)} "
                f"({_fmt(row['compiles_total'], 0, False)}) | {wall_text} "
                f"| {_fmt(row['executions_per_step'], 1, False)} "
                f"| {_fmt(row['step_ms'], 0, False)} + {_fmt(row['next_batch_ms'], 0, False)} "
                f"| {_fmt(row['peak_rss_mb'], 0, False)} "
                f"| {_fmt(row['final_loss'], 4, False)} | {'n/a' if diff is None else f'{diff:.1e}'} |"
            )
        lines += [
            "",
            "Loops: "
            + "; ".join(f"**{p}**: {r['loop']}" for p, r in summary[workload].items() if r.get("loop")),
        ]
        if any(p.startswith("xlapipe+compile") for p in summary[workload]):
            lines += [
                "",
                "† under compile_step torch_xla's ExecuteTime also counts executions queued "
                "behind one another, so wall / execute is not comparable to the lazy loops'.",
            ]
    if "memory" in summary:
        lines += [
            "",
            "## memory",
            "",
            DESCRIPTIONS["memory"],
            "",
            "| configuration | pipeline | runtime started | host copy in place | realised | "
            "realised less device copies (computed) | / replica_builds (host) | / replica_builds (realised) "
            "| / replica_builds (host, replicas only) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for peer, row in summary["memory"].items():
            if not row["ok"]:
                lines.append(f"| {peer} | failed: {(row['errors'] or ['?'])[0][:120]} ||||||||")
                continue
            less = (
                (row["pss_realised_mb"]["median"] - row["device_copies_mb"])
                if row["pss_realised_mb"]
                else None
            )
            lines.append(
                f"| {peer} | `{row['pipeline']}` | {_fmt(row['pss_runtime_mb'], 0)} | {_fmt(row['pss_host_mb'], 0)} "
                f"| {_fmt(row['pss_realised_mb'], 0)} | {'n/a' if less is None else f'{less:.0f}'} "
                f"| {_fmt(row.get('ratio_vs_replica_builds_host'), 3)} "
                f"| {_fmt(row.get('ratio_vs_replica_builds_realised'), 3)} "
                f"| {_fmt(row.get('replicas_ratio_vs_replica_builds_host'), 3)} |"
            )
        lines += [
            "",
            "Total PSS in MiB (parent + replicas). replica_builds: every replica builds its "
            "own model (what MpModelWrapper replaces); wrap_model_mp and parent_builds: the parent "
            "builds it once and forks. On the CPU runtime the XLA device is host memory, so "
            "'realised' holds one device copy per replica.",
        ]
    if "overhead" in summary:
        row = summary["overhead"].get("xlapipe", {})
        if row.get("ok"):
            lines += [
                "",
                "## overhead",
                "",
                DESCRIPTIONS["overhead"],
                "",
                f"`{row['pipeline']}`",
                "",
                "| part | median ms |",
                "|---|---|",
                f"| Pipeline(...) construction | {_fmt(row['build_ms'], 3)} |",
                f"| pipeline(setup) | {_fmt(row['apply_ms'], 3)} |",
                f"| total | {_fmt(row['total_ms'], 3)} |",
            ]
    return "\n".join(lines) + "\n"


def environment() -> dict:
    versions = {}
    for name in ("torch", "torch_xla", "accelerate", "transformers"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = "absent"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        commit = rev + ("+changes" if dirty else "")
    except OSError:
        commit = "unknown"
    return {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": versions,
        "commit": commit or "unknown",
        "pjrt_device": os.environ.get("PJRT_DEVICE", "CPU (default)"),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="modest", choices=tuple(SIZES))
    parser.add_argument("--repeats", type=int, help="default: 1 (smoke, modest), 3 (full)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--skip-peers",
        default="",
        help="comma-separated peers to leave out, everywhere (eager) or in one "
        "workload (bert:xlapipe+compile)",
    )
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument(
        "--render",
        metavar="DIR",
        help="rewrite DIR's results.json summary and results.md from its runs; run nothing",
    )
    opts = parser.parse_args(argv)
    if opts.render:
        return render(opts.render)
    chosen = [w for w in opts.workloads.split(",") if w]
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from {', '.join(WORKLOADS)}")
    skip = {p for p in opts.skip_peers.split(",") if p}
    repeats = opts.repeats or SIZES[opts.size]["repeats"]
    os.makedirs(os.path.join(opts.out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(opts.out, "logs"), exist_ok=True)
    env = environment()
    start = time.perf_counter()
    runs = []
    for repeat in range(repeats):
        for workload in chosen:
            peers = [p for p in PEERS[workload] if p not in skip and f"{workload}:{p}" not in skip]
            shift = repeat % len(peers) if peers else 0
            for peer in peers[shift:] + peers[:shift]:
                record = run_one(workload, peer, opts.size, repeat, opts.out, opts.timeout)
                runs.append(record)
                figure = (
                    f"{record.get('steps_per_s', float('nan')):.2f} steps/s"
                    if "steps_per_s" in record
                    else f"{record['total_pss_mb']['realised']:.0f} MiB"
                    if "total_pss_mb" in record
                    else f"{record['total']['median_ms']:.3f} ms"
                    if "total" in record
                    else record.get("error", "")[:200]
                )
                print(
                    f"[{repeat + 1}/{repeats}] {workload:9s} {peer:20s} {record['status']:7s} "
                    f"{figure} ({record['process_s']:.0f} s)",
                    flush=True,
                )
    env["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    summary = summarise(runs)
    result = {
        "command": shlex.join(["python", "-m", "bench.run", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "size": opts.size,
        "repeats": repeats,
        "suite_s": time.perf_counter() - start,
        "environment": env,
        "summary": summary,
        "targets": targets(summary, runs),
        "runs": runs,
    }
    write(result, opts.out)
    return 0 if all(r["status"] != "failed" for r in runs) else 1


def write(result: dict, out: str) -> None:
    """``results.json`` and ``results.md`` in ``out``; the targets table on stdout."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    print(f"\nwrote {os.path.join(out, 'results.json')} and results.md\n")
    print(text.split("## ", 2)[1] if "## " in text else text)


def render(out: str) -> int:
    """Summarise the runs of ``out/results.json`` again (after a change to the report), run nothing."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        raise SystemExit(f"--render {out}: no results.json there; run the suite with --out {out} first")
    with open(path) as f:
        result = json.load(f)
    summary = summarise(result["runs"])
    write({**result, "summary": summary, "targets": targets(summary, result["runs"])}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
