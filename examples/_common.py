"""What the example workloads share: flags, the pipeline they select, the training
function each replica runs, and the report (see docs/examples.md).

A workload script is run as ``python SCRIPT [flags] [--pipeline JSON] [--report PATH]``;
``--print-pipeline`` prints the selected pipeline's description and exits.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from xlapipe import runtime

# Entry point: choose the PJRT device before torch_xla is imported anywhere
# (transformers imports it too), and never reach for a model hub.
PJRT_DEVICE = runtime.ensure_pjrt_device()
ON_TPU = PJRT_DEVICE.upper() == "TPU"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from attrs import frozen  # noqa: E402
from torch import nn  # noqa: E402

import xlapipe as xp  # noqa: E402
from xlapipe.launch import launch  # noqa: E402
from xlapipe.metrics import Meter, json_safe, wait_for_device  # noqa: E402
from xlapipe.transforms import static_shapes  # noqa: E402

LossFn = Callable[[nn.Module, Any], torch.Tensor]
PredictFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, torch.Tensor]"]
SchedulerFn = Callable[[torch.optim.Optimizer, int, argparse.Namespace], Any]


@frozen
class Workload:
    """One example: how to build it and how to train and score it."""

    name: str
    description: str
    presets: dict[str, dict[str, Any]]  # size -> flag defaults (lr, batch_size, ...)
    add_flags: Callable[[argparse.ArgumentParser], None]
    build: Callable[[argparse.Namespace], xp.TrainingSetup]  # CPU model, optimizer, loaders
    loss_fn: LossFn
    predict: PredictFn  # (predicted labels, true labels) for one evaluation batch
    scheduler: SchedulerFn  # built from run.optimizer inside the replica
    text: bool = False  # offers static_shapes
    transformers: bool = False  # a transformers model: offers hf_traced_masks


def parser(workload: Workload) -> argparse.ArgumentParser:
    """The common flags plus the workload's own."""
    p = argparse.ArgumentParser(description=workload.description)
    p.add_argument("--size", choices=tuple(workload.presets),
                   help="model preset (default: base on a TPU, small otherwise)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None, help="cap on training steps per epoch")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timed figures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--eval-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    g = p.add_argument_group("practices (each on by default; one flag switches one off)")
    g.add_argument("--no-device", action="store_true",
                   help="train eagerly on the CPU (drops with_device and what needs it)")
    g.add_argument("--no-model-mp", action="store_true", help="drop wrap_model_mp")
    g.add_argument("--no-loader-mp", action="store_true", help="drop wrap_loader_mp")
    g.add_argument("--no-default-tensor-type", action="store_true", help="drop set_default_tensor_type")
    g.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                   help="default bf16 on a TPU, fp32 on the CPU runtime; fp32 means no with_precision")
    g.add_argument("--precision-mode", choices=("autocast", "downcast", "env"), default="autocast")
    if workload.transformers:
        g.add_argument("--no-hf-masks", action="store_true", help="drop hf_traced_masks")
    o = p.add_argument_group("opt-in practices")
    o.add_argument("--compile-step", action="store_true",
                   help="add compile_step(optimizer=False): forward and backward compiled "
                        "(the learning-rate schedule keeps the optimizer update lazy)")
    o.add_argument("--recompile-guard", choices=("warn", "raise"), default=None,
                   help="add recompile_guard(warmup=--warmup, action=...)")
    workload.add_flags(p)
    p.add_argument("--pipeline", default=None,
                   help="JSON pipeline description; replaces the pipeline the practice flags select")
    p.add_argument("--print-pipeline", action="store_true",
                   help="print the selected pipeline's JSON description and exit")
    p.add_argument("--report", default=None, help="also write the report as JSON to this path")
    return p


def parse(workload: Workload, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags and fill what depends on the size preset and the runtime."""
    p = parser(workload)
    args = p.parse_args(argv)
    args.size = args.size or ("base" if ON_TPU else "small")
    for key, value in workload.presets[args.size].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.precision = args.precision or ("bf16" if ON_TPU else "fp32")
    for flag in ("epochs", "warmup", "batch_size", "train_size", "eval_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < (0 if flag == "warmup" else 1):
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.max_steps is not None and args.max_steps < 1:
        p.error(f"--max-steps must be positive, got {args.max_steps}")
    return args


def shapes_transform(args: argparse.Namespace) -> xp.Transform | None:
    """static_shapes as the text flags ask, or None (pad to the longest item)."""
    if args.no_static_shapes:
        if args.drop_last:
            raise SystemExit("--drop-last is an option of static_shapes; drop --no-static-shapes or --drop-last")
        return None
    drop = ("train",) if args.drop_last else ()
    if args.buckets:
        try:
            buckets = tuple(int(b) for b in args.buckets.split(","))
        except ValueError:
            raise SystemExit(f"--buckets takes lengths separated by commas, e.g. 32,64,128; got {args.buckets!r}")
        return static_shapes(buckets=buckets, drop_last=drop)
    return static_shapes(length=args.seq_len, drop_last=drop)


def select_pipeline(workload: Workload, args: argparse.Namespace) -> xp.Pipeline:
    """``--pipeline`` if given, else the default pipeline less the practices switched off."""
    if args.pipeline:
        try:
            description = json.loads(args.pipeline)
        except json.JSONDecodeError as error:
            raise SystemExit(f"--pipeline is not valid JSON ({error}); give a list of "
                             '{"name": ..., "params": {...}} objects') from error
        return xp.Pipeline.from_description(description)
    device = not args.no_device
    if not device and (args.compile_step or args.recompile_guard):
        raise SystemExit("--compile-step and --recompile-guard need the XLA device; drop --no-device")
    chosen: list[xp.Transform] = []
    if device:
        chosen.append(xp.with_device())
    if args.precision != "fp32":
        chosen.append(xp.with_precision(args.precision, args.precision_mode))
    if device and not args.no_model_mp:
        chosen.append(xp.wrap_model_mp())
    if device and workload.transformers and not args.no_hf_masks:
        chosen.append(xp.hf_traced_masks())
    if workload.text:
        shapes = shapes_transform(args)
        if shapes is not None:
            chosen.append(shapes)
    if device and not args.no_loader_mp:
        chosen.append(xp.wrap_loader_mp())
    if not args.no_default_tensor_type:
        chosen.append(xp.set_default_tensor_type())
    if args.compile_step:
        chosen.append(xp.compile_step(optimizer=False))
    if args.recompile_guard:
        chosen.append(xp.recompile_guard(warmup=args.warmup, action=args.recompile_guard))
    return xp.Pipeline(*chosen)


# -- what each replica runs ------------------------------------------------------------

def _sync(run: xp.Run) -> None:
    if run.device.type == "xla" and not run.loader_syncs:
        import torch_xla

        torch_xla.sync()


def evaluate(run: xp.Run, workload: Workload) -> float:
    """Accuracy on the "eval" loader, under the run's precision, without gradients."""
    run.model.eval()
    counts, total = [], 0
    with torch.no_grad(), run.autocast(), xp.unguarded(run):
        for batch in run.loaders["eval"]:
            if not run.loader_syncs:
                batch = xp.to_device(batch, run.device)
            predicted, labels = workload.predict(run.model, batch)
            counts.append((predicted == labels).sum())
            total += int(labels.shape[0])
            _sync(run)
    run.model.train()
    if not total:
        raise ValueError("the eval loader gave no batches: give --eval-size of at least 1")
    return float(torch.stack(counts).sum().item()) / total


def train(index: int, setup: xp.TrainingSetup, workload: Workload, args: argparse.Namespace,
          pipeline: xp.Pipeline) -> dict[str, Any]:
    """The replica's training function: realise the setup, train, time, evaluate."""
    with xp.session(setup) as run:
        loader = run.loaders["train"]
        per_epoch = len(loader)
        steps = min(per_epoch, args.max_steps or per_epoch)
        scheduler = workload.scheduler(run.optimizer, steps * args.epochs, args)
        meter = Meter(warmup=args.warmup, on_xla=True)
        epoch_times: list[float] = []
        loss = None
        for epoch in range(args.epochs):
            first_step, start = meter.steps, time.perf_counter()
            for i, batch in enumerate(loader):
                if i >= steps:
                    break
                loss = run.step(batch, workload.loss_fn)
                scheduler.step()
                meter.tick()
            wait_for_device(run.device.type == "xla")
            elapsed = time.perf_counter() - start
            if first_step >= args.warmup and steps == per_epoch:
                epoch_times.append(elapsed)
            if index == 0:
                print(f"epoch {epoch + 1}/{args.epochs}: {meter.steps - first_step} steps in "
                      f"{elapsed:.1f} s, loss {float(loss):.4f}", flush=True)
        report: dict[str, Any] = meter.report()
        report["final_loss"] = float(loss) if loss is not None else float("nan")
        if epoch_times:
            report["epoch_s"] = sum(epoch_times) / len(epoch_times)
            report["epoch_s_extrapolated"] = False
        elif "steps_per_s" in report:
            report["epoch_s"] = per_epoch / report["steps_per_s"]
            report["epoch_s_extrapolated"] = True
        eval_start = time.perf_counter()
        report["metric"] = evaluate(run, workload)
        report["eval_s"] = time.perf_counter() - eval_start
        report["metric_history"] = [[meter.elapsed_s, report["metric"]]]  # seconds since training started
    report.update(
        metric_name="accuracy",
        steps_per_epoch=per_epoch,
        pipeline=repr(pipeline),
        pipeline_description=pipeline.describe(),
        workload=workload.name,
        size=args.size,
        device=str(run.device),
    )
    return report


# -- the script ---------------------------------------------------------------------

def main(workload: Workload, argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Parse flags, build the setup on the CPU, launch the replicas, report."""
    args = parse(workload, argv)
    pipeline = select_pipeline(workload, args)
    if args.print_pipeline:
        print(json.dumps(pipeline.describe()))
        return None
    print(f"{workload.name} ({args.size}) on PJRT_DEVICE={PJRT_DEVICE}: {pipeline!r}", flush=True)
    torch.manual_seed(args.seed)
    setup = pipeline(workload.build(args))  # decides only: nothing touches the device here
    report = launch(train, setup, workload, args, pipeline)
    report = json_safe(report)
    print(summary(report), flush=True)
    text = json.dumps(report, sort_keys=True)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return report


def summary(report: dict[str, Any]) -> str:
    """One line with the figures the original benchmark reported."""
    def fmt(key: str, spec: str = ".3g") -> str:
        value = report.get(key)
        return "n/a" if value is None else format(value, spec)

    extrapolated = " (extrapolated)" if report.get("epoch_s_extrapolated") else ""
    return (f"epoch {fmt('epoch_s')} s{extrapolated}, {fmt('steps_per_s')} steps/s, "
            f"{fmt('compiles_total', '.0f')} compilations ({fmt('compiles_after_warmup', '.0f')} after "
            f"warm-up), final loss {fmt('final_loss', '.4f')}, accuracy {fmt('metric')}")

