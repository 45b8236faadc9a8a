"""scan_layers against the unrolled layer stack: compile time, time to the first update, steps/s.

    .venv/bin/python -m bench.scan --out results/scan                    # BERT 4 and 12 layers, 3 repeats
    .venv/bin/python -m bench.scan --layers 2 --repeats 1 --steps 3 --out /tmp/scan   # a first look

The model is the NLP example's small BERT (hidden 256, 4 heads, intermediate
1024, its vocabulary) with ``--layers`` layers, trained with AdamW in fp32 on
the example's synthetic sentence pairs padded to 128 tokens, batch 16. The
pipeline is ``with_device, hf_traced_masks`` (the step issues its step
marker, so the first update is done when it returns and the device is
waited for), plus ``scan_layers()`` for the scanned variant. Each (layers, variant) run is a
fresh process, since torch_xla keeps compiled graphs for the life of a
process; repeat r runs the variants in an order rotated by r. Per run:

- ``first_update_s``: from entering the session (model moved) to the first
  optimizer update done on the device, compilation included;
- ``compile_s``: XLA compile seconds over the whole run (``CompileTime``);
  ``compiles``: graphs compiled (``UncachedCompile``);
- ``steps_per_s`` after ``--warmup`` steps, over ``--steps`` more.

Writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

from xlapipe import child_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("unrolled", "scanned")
LENGTH, BATCH = 128, 16


def child(layers: int, variant: str, warmup: int, steps: int, seed: int) -> dict:
    """One run in this process: the report as a dict."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import xlapipe as xp
    from bench import workloads
    from xlapipe import metrics

    config = dict(workloads.nlp_example().MODELS["small"], num_hidden_layers=layers)

    def build(seed: int) -> torch.nn.Module:
        from transformers import BertConfig, BertForSequenceClassification
        from transformers.utils import logging

        logging.set_verbosity_error()
        torch.manual_seed(seed)
        return BertForSequenceClassification(BertConfig(num_labels=2, **config))

    n = BATCH * (warmup + steps)
    loader = torch.utils.data.DataLoader(
        workloads.pairs(n, seed), batch_size=BATCH, collate_fn=workloads.PadText(LENGTH)
    )
    pipeline = xp.Pipeline(
        xp.with_device(), xp.hf_traced_masks(), *([xp.scan_layers()] if variant == "scanned" else [])
    )
    setup = xp.TrainingSetup(build(seed), lambda p: torch.optim.AdamW(p, lr=2e-5), {"train": loader})
    from xlapipe.transforms.compile_step import native_dropout_is_correct

    native_dropout_is_correct()  # starts the runtime and runs scan_layers' probe: not the model's cost
    before = metrics.xla_figures()
    losses = []
    start = time.perf_counter()
    with xp.session(pipeline(setup)) as run:
        run.model.train()
        meter = metrics.Meter(warmup=warmup, on_xla=True)
        first = None
        compiled = []  # graphs compiled by each step
        for batch in run.loaders["train"]:
            count = metrics.counter("UncachedCompile")
            losses.append(run.step(batch, workloads.text_loss))
            compiled.append(metrics.counter("UncachedCompile") - count)
            if first is None:
                metrics.wait_for_device(True)
                first = time.perf_counter() - start
            meter.tick()
        report = meter.report()
    figures = metrics.xla_figures()
    return {
        "layers": layers,
        "variant": variant,
        "pipeline": repr(pipeline),
        "first_update_s": first,
        "compile_s": figures["compile_s"] - before["compile_s"],
        "compiles": figures["compiles"] - before["compiles"],
        "steps_per_s": report.get("steps_per_s"),
        "measured_steps": report.get("measured_steps"),
        "execute_s_after_warmup": report.get("execute_s_after_warmup"),
        "compiles_after_warmup": report.get("compiles_after_warmup"),
        "compiled_per_step": compiled,
        "losses": [float(v) for v in losses],
        "peak_rss_mb": report["peak_rss_mb"],
    }


def run_one(layers: int, variant: str, opts: argparse.Namespace, path: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "bench.scan",
        "--child",
        "--layers",
        str(layers),
        "--variant",
        variant,
        "--warmup",
        str(opts.warmup),
        "--steps",
        str(opts.steps),
        "--seed",
        str(opts.seed),
        "--json",
        path,
    ]
    env = dict(
        os.environ,
        PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"),
        CPU_NUM_DEVICES="1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    began, load = time.perf_counter(), os.getloadavg()[0]
    log = os.path.splitext(path)[0] + ".log"
    done = child_process.run(cmd, log=log, env=env, cwd=REPO, limit=opts.timeout, result=path)
    if done.status != "ended" or done.result is None:
        return {
            "layers": layers,
            "variant": variant,
            "status": "failed",
            "error": f"{done.status}: {done.tail(2000)}",
            "process_s": time.perf_counter() - began,
        }
    return {
        **done.result,
        "status": "ok",
        "process_s": time.perf_counter() - began,
        "load_1min": [load, os.getloadavg()[0]],
    }  # the machine's load before and after the run


def summarise(runs: list[dict], layer_counts: list[int]) -> list[dict]:
    """Per layer count: each variant's medians, and scanned/unrolled ratios paired by repeat."""
    import attrs

    from xlapipe.ablation.stats import Stats

    def stats(values) -> dict | None:
        found = Stats.of(values)
        return attrs.asdict(found) if found is not None else None

    rows = []
    for layers in layer_counts:
        ok = [r for r in runs if r["layers"] == layers and r["status"] == "ok"]
        row: dict = {"layers": layers}
        for variant in VARIANTS:
            mine = [r for r in ok if r["variant"] == variant]
            row[variant] = {
                k: stats(r[k] for r in mine if r.get(k) is not None)
                for k in ("first_update_s", "compile_s", "compiles", "steps_per_s")
            }
        pairs = [
            (s, u)
            for s in ok
            if s["variant"] == "scanned"
            for u in ok
            if u["variant"] == "unrolled" and u["repeat"] == s["repeat"]
        ]
        row["ratio"] = {
            k: stats(s[k] / u[k] for s, u in pairs if s.get(k) and u.get(k))
            for k in ("first_update_s", "compile_s", "steps_per_s")
        }
        rows.append(row)
    return rows


def _fmt(stats: dict | None, digits: int = 2) -> str:
    if stats is None:
        return "n/a"
    return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}–{stats['max']:.{digits}f})"


def markdown(result: dict) -> str:
    lines = [
        f"`{result['command']}`, {result['date']}, {result['repeats']} repeat(s), "
        f"{result['warmup']} warm-up + {result['steps']} measured steps; median (min–max)",
        "",
        "| layers | variant | first update s | XLA compile s | graphs compiled | steps/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        for variant in VARIANTS:
            s = row[variant]
            lines.append(
                f"| {row['layers']} | {variant} | {_fmt(s['first_update_s'], 1)} | "
                f"{_fmt(s['compile_s'], 1)} | {_fmt(s['compiles'], 0)} | {_fmt(s['steps_per_s'], 3)} |"
            )
        r = row["ratio"]
        lines.append(
            f"| {row['layers']} | **scanned / unrolled** | {_fmt(r['first_update_s'], 3)} | "
            f"{_fmt(r['compile_s'], 3)} | | {_fmt(r['steps_per_s'], 3)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", default="4,12", help="comma-separated layer counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="measured steps after warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--out", default="results/scan")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        record = child(int(opts.layers), opts.variant, opts.warmup, opts.steps, opts.seed)
        with open(opts.json, "w") as f:
            json.dump(record, f)
        return 0
    counts = [int(n) for n in opts.layers.split(",") if n]
    os.makedirs(os.path.join(opts.out, "runs"), exist_ok=True)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = []
    for repeat in range(opts.repeats):
        for layers in counts:
            order = VARIANTS[repeat % 2 :] + VARIANTS[: repeat % 2]
            for variant in order:
                path = os.path.join(opts.out, "runs", f"{layers}-{variant}-{repeat}.json")
                record = {**run_one(layers, variant, opts, path), "repeat": repeat}
                runs.append(record)
                shown = (
                    f"first update {record['first_update_s']:.1f} s, compile {record['compile_s']:.1f} s, "
                    f"{record['steps_per_s']:.3f} steps/s"
                    if record["status"] == "ok"
                    else record["error"][-300:]
                )
                print(
                    f"[{repeat + 1}/{opts.repeats}] {layers:2d} layers {variant:9s} {shown} "
                    f"({record['process_s']:.0f} s, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    result = {
        "command": shlex.join(["python", "-m", "bench.scan", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "repeats": opts.repeats,
        "warmup": opts.warmup,
        "steps": opts.steps,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "summary": summarise(runs, counts),
        "runs": runs,
    }
    text = markdown(result)
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(opts.out, "results.md"), "w") as f:
        f.write(text)
    print("\n" + text)
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
