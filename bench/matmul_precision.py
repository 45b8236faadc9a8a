"""What the matmul precision level does on this runtime: results and speed under each level.

    .venv/bin/python -m bench.matmul_precision --out results/matmul-precision

Each level (``default``, ``high``, ``highest``) runs in a fresh process, set
before anything is compiled (``xlapipe.transforms.matmul_precision.switch``,
what ``with_matmul_precision`` does on a TPU): a 512 x 1024 by 1024 x 512 fp32
matmul against the fp64 product, and ``--steps`` training steps of the NLP
example's BERT at ``--size`` in fp32 (the example's pairs padded to 128
tokens, batch 16, AdamW). The report says whether the results are bitwise the
same under every level, and each level's steps/s after ``--warmup`` steps.
On a TPU, ``default`` would differ from ``highest`` by bf16 rounding.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVELS = ("default", "high", "highest")


def child(level: str, size: str, warmup: int, steps: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import torch_xla
    import torch_xla.backends as backends

    import xlapipe as xp
    from bench import workloads
    from xlapipe import metrics
    from xlapipe.transforms.matmul_precision import switch

    switch(level)  # before the first compile of this process
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=g), torch.randn(1024, 512, generator=g)
    product = (a.to(torch_xla.device()) @ b.to(torch_xla.device())).cpu()
    matmul_error = float((product.double() - a.double() @ b.double()).abs().max())
    loader = torch.utils.data.DataLoader(
        workloads.pairs(16 * (warmup + steps), 0), batch_size=16, collate_fn=workloads.PadText(128)
    )
    setup = xp.TrainingSetup(
        workloads.bert(size)(0), lambda p: torch.optim.AdamW(p, lr=2e-5), {"train": loader}
    )
    losses = []
    with xp.session(xp.Pipeline(xp.with_device(), xp.hf_traced_masks())(setup)) as run:
        run.model.train()
        meter = metrics.Meter(warmup=warmup, on_xla=True)
        for batch in run.loaders["train"]:
            losses.append(run.step(batch, workloads.text_loss))
            meter.tick()
        report = meter.report()
    return {
        "level": level,
        "level_in_force": backends.get_mat_mul_precision(),
        "matmul_max_error": matmul_error,
        "product_bits": product.view(torch.int32).sum().item(),
        "losses_hex": [float(v).hex() for v in losses],
        "steps_per_s": report.get("steps_per_s"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small", "base"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="results/matmul-precision")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        with open(opts.json, "w") as f:
            json.dump(child(opts.child, opts.size, opts.warmup, opts.steps), f)
        return 0
    from xlapipe import child_process  # here: a child sets its level before it imports xlapipe

    os.makedirs(opts.out, exist_ok=True)
    env = dict(
        os.environ,
        PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"),
        CPU_NUM_DEVICES="1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    runs = []
    for repeat in range(opts.repeats):
        for level in LEVELS[repeat % 3 :] + LEVELS[: repeat % 3]:
            path = os.path.join(opts.out, f"{level}-{repeat}.json")
            cmd = [
                sys.executable,
                "-m",
                "bench.matmul_precision",
                "--child",
                level,
                "--size",
                opts.size,
                "--warmup",
                str(opts.warmup),
                "--steps",
                str(opts.steps),
                "--json",
                path,
            ]
            log = os.path.splitext(path)[0] + ".log"
            done = child_process.run(cmd, log=log, env=env, cwd=REPO, limit=1800, result=path)
            if done.status != "ended" or done.result is None:
                print(f"{done.status}: {done.tail(2000)}", file=sys.stderr)
                return 1
            runs.append({**done.result, "repeat": repeat})
            print(
                f"[{repeat + 1}/{opts.repeats}] {level:8s} {runs[-1]['steps_per_s']:.3f} steps/s", flush=True
            )
    first = runs[0]
    same = all(
        r["losses_hex"] == first["losses_hex"] and r["product_bits"] == first["product_bits"] for r in runs
    )
    lines = [
        f"`{shlex.join(['python', '-m', 'bench.matmul_precision', *(argv or sys.argv[1:])])}`, "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}, BERT {opts.size}, "
        f"{opts.warmup} warm-up + {opts.steps} measured steps, {opts.repeats} repeat(s)",
        "",
        "| level | level in force | max error of a 512x1024x512 matmul vs fp64 | steps/s per repeat |",
        "|---|---|---|---|",
    ]
    for level in LEVELS:
        mine = [r for r in runs if r["level"] == level]
        lines.append(
            f"| {level} | {mine[0]['level_in_force']} | {mine[0]['matmul_max_error']:.2e} | "
            + ", ".join(f"{r['steps_per_s']:.3f}" for r in mine)
            + " |"
        )
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=g), torch.randn(1024, 512, generator=g)
    one_pass = float(
        ((a.bfloat16().float() @ b.bfloat16().float()).double() - a.double() @ b.double()).abs().max()
    )
    lines += [
        "",
        f"Matmul results and every training loss bitwise the same under all levels: **{same}**. "
        f"For scale, one bf16 pass (inputs rounded to bf16, fp32 accumulation; emulated on the host) "
        f"errs by {one_pass:.2e} on the same matmul.",
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump(
            {"runs": runs, "bitwise_same": same, "load": os.getloadavg(), "time": time.time()}, f, indent=1
        )
    with open(os.path.join(opts.out, "results.md"), "w") as f:
        f.write(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
