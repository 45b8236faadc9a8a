"""A tiny workload that follows the xlapipe workload contract: copy it for your model.

    python tests/workloads/tiny_mlp.py --print-pipeline
    python tests/workloads/tiny_mlp.py --max-steps 8 --warmup 2 --report /tmp/r.json
    xlapipe ablate tests/workloads/tiny_mlp.py -- --max-steps 8 --warmup 2

The practice flags (``--no-device`` ...) choose the full pipeline; ``--pipeline
JSON`` replaces it; ``--report PATH`` writes the report as one JSON object.
``train(pipeline, ...)`` is also a function target:
``xlapipe ablate tests/workloads/tiny_mlp.py:train --pipeline JSON``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
from torch import nn

import xlapipe as xp
from xlapipe import runtime
from xlapipe.metrics import Meter

SIZES = {"tiny": 16, "small": 64}  # hidden width per --size preset


def pipeline_from_flags(opts: argparse.Namespace) -> xp.Pipeline:
    """The full pipeline the practice flags select."""
    ts = []
    if not opts.no_device:
        ts.append(xp.with_device())
        if not opts.no_model_mp:
            ts.append(xp.wrap_model_mp())
        if not opts.no_loader_mp:
            ts.append(xp.wrap_loader_mp())
    if not opts.no_default_dtype:
        ts.append(xp.set_default_tensor_type("float32"))
    if opts.precision != "fp32":
        ts.append(xp.with_precision(opts.precision))
    return xp.Pipeline(*ts)


def _data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def evaluate(run: xp.Run) -> float:
    """Accuracy on the "eval" loader."""
    correct = total = 0
    run.model.eval()
    with torch.no_grad(), run.autocast():
        for batch in run.loaders["eval"]:
            x, y = xp.to_device(batch, run.device) if not run.marks_step_elsewhere else batch
            correct += int((run.model(x).argmax(1) == y).sum())
            total += len(y)
    run.model.train()
    return correct / total


def train(
    pipeline: xp.Pipeline,
    *,
    size: str = "tiny",
    epochs: int = 1,
    max_steps: int | None = None,
    warmup: int = 2,
    seed: int = 0,
    train_size: int = 128,
    eval_size: int = 64,
    batch_size: int = 16,
    eval_every: int | None = None,
) -> dict:
    """Train under ``pipeline`` and return the contract's report.

    ``eval_every``: also evaluate every so many steps, for the report's
    ``metric_history`` (``[[seconds since training started, accuracy], ...]``).
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, SIZES[size]), nn.ReLU(), nn.Linear(SIZES[size], 2))
    train_loader = torch.utils.data.DataLoader(_data(train_size, seed + 1), batch_size=batch_size)
    eval_loader = torch.utils.data.DataLoader(_data(eval_size, seed + 2), batch_size=batch_size)
    setup = xp.TrainingSetup(
        model, lambda ps: torch.optim.SGD(ps, lr=0.1), {"train": train_loader, "eval": eval_loader}
    )
    setup = pipeline(setup)
    steps_per_epoch = len(train_loader) if max_steps is None else min(max_steps, len(train_loader))
    with xp.session(setup) as run:
        meter = Meter(warmup=warmup, on_xla=run.device.type == "xla")
        loss = torch.tensor(float("nan"))
        history = []
        for _ in range(epochs):
            for i, batch in enumerate(run.loaders["train"]):
                if i >= steps_per_epoch:
                    break
                loss = run.step(batch, loss_fn)
                meter.tick()
                if eval_every and meter.steps % eval_every == 0:
                    history.append([meter.elapsed_s, evaluate(run)])
        report = meter.report()
        start = time.perf_counter()
        accuracy = evaluate(run)
        eval_s = time.perf_counter() - start
        history.append([meter.elapsed_s, accuracy])
        final_loss = float(loss)
    rate = report.get("steps_per_s", math.nan)
    report.update(
        epoch_s=len(train_loader) / rate if rate and rate > 0 else math.nan,
        epoch_s_extrapolated=steps_per_epoch < len(train_loader),
        final_loss=final_loss,
        metric=accuracy,
        metric_name="accuracy",
        eval_s=eval_s,
        metric_history=history,
        pipeline=repr(pipeline),
        pipeline_description=pipeline.describe(),
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=SIZES, default="tiny")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="cap on training steps per epoch")
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the timed figures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-size", type=int, default=128)
    p.add_argument("--eval-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--eval-every", type=int, default=None, help="also evaluate every N steps (metric_history)"
    )
    for flag in ("device", "model-mp", "loader-mp", "default-dtype"):
        p.add_argument(f"--no-{flag}", action="store_true", help=f"leave out the {flag} practice")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--pipeline", help="JSON pipeline description; replaces the practice flags")
    p.add_argument("--print-pipeline", action="store_true", help="print the pipeline as JSON and exit")
    p.add_argument("--report", help="also write the report (JSON) to this path")
    opts = p.parse_args(argv)

    pipeline = (
        xp.Pipeline.from_description(json.loads(opts.pipeline))
        if opts.pipeline
        else pipeline_from_flags(opts)
    )
    if opts.print_pipeline:
        print(json.dumps(pipeline.describe()))
        return 0
    runtime.ensure_pjrt_device()
    report = train(
        pipeline,
        size=opts.size,
        epochs=opts.epochs,
        max_steps=opts.max_steps,
        warmup=opts.warmup,
        seed=opts.seed,
        train_size=opts.train_size,
        eval_size=opts.eval_size,
        batch_size=opts.batch_size,
        eval_every=opts.eval_every,
    )
    print(json.dumps({k: report[k] for k in ("epoch_s", "final_loss", "metric")}))
    if opts.report:
        with open(opts.report, "w") as f:
            json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
