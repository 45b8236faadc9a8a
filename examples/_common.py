"""What the example workloads share: flags, the default pipeline and the changes the flags
make to it, the training function each replica runs, and the report (see docs/examples.md).

A workload script is run as ``python SCRIPT [flags] [--pipeline JSON] [--report PATH]``;
``--print-pipeline`` prints the selected pipeline's description and exits.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import re
import sys
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

LossFn = Callable[[nn.Module, Any], torch.Tensor]
PredictFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, torch.Tensor]"]
SchedulerFn = Callable[..., Any]  # (optimizer, total_updates, args) -> LR scheduler
SEQ_LEN = 128  # the fixed length the text workloads pad to (static_shapes)


@frozen
class Workload:
    """One example: how to build it and how to train and score it."""

    name: str
    description: str
    presets: dict[str, dict[str, Any]]  # size -> flag defaults (lr, batch_size, ...)
    build: Callable[[argparse.Namespace], xp.TrainingSetup]  # CPU model, optimizer, loaders
    loss_fn: LossFn
    predict: PredictFn  # (predicted labels, true labels) for one evaluation batch
    scheduler: SchedulerFn  # built by the run on its own optimizer
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None  # the workload's own flags
    text: bool = False  # variable-length text: static_shapes in the default pipeline
    transformers: bool = False  # a transformers model: hf_traced_masks in the default pipeline


def default_pipeline(
    workload: Workload | None = None, *, text: bool = False, transformers: bool = False, on_tpu: bool = ON_TPU
) -> xp.Pipeline:
    """The practices a workload trains with unless told otherwise: the examples', the ablation's
    (through ``--print-pipeline``) and the benchmark's default, defined here only.

    ``text``: variable-length text (``static_shapes``); ``transformers``: a
    transformers model (``hf_traced_masks``); both are read from ``workload``
    when given.
    """
    if workload is not None:
        text, transformers = workload.text, workload.transformers
    chosen: list[xp.Transform] = [xp.with_device()]
    if on_tpu:
        chosen.append(xp.with_precision("bf16"))  # bf16 units on a TPU; slower than fp32 on CPU XLA
    chosen.append(xp.wrap_model_mp())
    if transformers:
        chosen.append(xp.hf_traced_masks())
    if text:
        chosen.append(xp.static_shapes(length=SEQ_LEN))
    chosen += [xp.wrap_loader_mp(), xp.set_default_tensor_type()]
    return xp.Pipeline(*chosen)


# -- flags ---------------------------------------------------------------------------------


class _Change(argparse.Action):
    """Collect --with and --without in the order given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        value: Any,
        option: str | None = None,
    ) -> None:
        changes = list(getattr(namespace, "changes", None) or [])
        changes.append((self.const, value))
        namespace.changes = changes


def parser(workload: Workload) -> argparse.ArgumentParser:
    """The common flags plus the workload's own."""
    p = argparse.ArgumentParser(description=workload.description)
    p.add_argument(
        "--size",
        choices=tuple(workload.presets),
        help="model preset (default: base on a TPU, small otherwise)",
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--max-steps", type=int, default=None, help="cap on training steps (micro-batches) per epoch"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="updates left out of the timed figures (with --accumulate K, K steps each)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--eval-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    t = p.add_argument_group("training (each adds a transform to the pipeline)")
    t.add_argument(
        "--accumulate",
        type=int,
        default=None,
        metavar="K",
        help="accumulate_grad(K): one optimizer update every K micro-batches",
    )
    t.add_argument(
        "--max-grad-norm",
        type=float,
        default=None,
        metavar="X",
        help="clip_grad_norm(X): clip the gradients' norm to X (the HF Trainer uses 1.0)",
    )
    t.add_argument(
        "--log-every",
        type=int,
        default=None,
        metavar="N",
        help="log_every(N): loss, gradient norm and learning rate every N steps, without a sync",
    )
    g = p.add_argument_group("practices (any registered transform, including your own)")
    g.add_argument(
        "--without",
        action=_Change,
        const="without",
        dest="changes",
        metavar="NAME",
        help="drop the transform NAME and what needs it (repeatable)",
    )
    g.add_argument(
        "--with",
        action=_Change,
        const="with",
        dest="changes",
        metavar="'NAME{json}'",
        help="add the transform NAME with these parameters, or replace the one of that name "
        "(repeatable), e.g. --with 'compile_step{\"optimizer\": false}'",
    )
    g.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: it registers transforms of your own (repeatable)",
    )
    if workload.add_flags is not None:
        workload.add_flags(p)
    p.add_argument(
        "--pipeline",
        default=None,
        help="JSON pipeline description; replaces the pipeline the flags above select",
    )
    p.add_argument(
        "--print-pipeline",
        action="store_true",
        help="print the selected pipeline's JSON description and exit",
    )
    p.add_argument("--report", default=None, help="also write the report as JSON to this path")
    return p


def parse(workload: Workload, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags and fill what depends on the size preset."""
    p = parser(workload)
    args = p.parse_args(argv)
    args.changes = getattr(args, "changes", None) or []
    args.size = args.size or ("base" if ON_TPU else "small")
    for key, value in workload.presets[args.size].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for flag in (
        "epochs",
        "warmup",
        "batch_size",
        "train_size",
        "eval_size",
        "max_steps",
        "accumulate",
        "log_every",
    ):
        value, least = getattr(args, flag), 0 if flag == "warmup" else 1
        if value is not None and value < least:
            p.error(
                f"--{flag.replace('_', '-')} must be {'non-negative' if least == 0 else 'positive'}, got {value}"
            )
    return args


_WITH = re.compile(r"^\s*([A-Za-z_]\w*)\s*(\{.*\})?\s*$", re.S)


def parse_with(text: str) -> xp.Transform:
    """``'NAME'`` or ``'NAME{json params}'`` as a transform from the registry."""
    match = _WITH.match(text)
    if not match:
        raise SystemExit(
            f"--with takes NAME or 'NAME{{json params}}', e.g. --with 'accumulate_grad{{\"steps\": 4}}'; "
            f"got {text!r}"
        )
    name, params = match.group(1), match.group(2)
    try:
        values = json.loads(params) if params else {}
    except json.JSONDecodeError as error:
        raise SystemExit(f"--with {name}: the parameters are not valid JSON ({error}): {params}") from None
    if not isinstance(values, dict):
        raise SystemExit(f"--with {name}: the parameters must be a JSON object, got {params}")
    try:
        return xp.rebuild(name, values)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"--with {name}: {error}") from None


def apply_changes(pipeline: xp.Pipeline, changes: Sequence[tuple[str, Any]]) -> xp.Pipeline:
    """``pipeline`` with each ``("with", transform | text)`` or ``("without", name)`` applied in turn."""
    for kind, value in changes:
        try:
            if kind == "without":
                if value not in pipeline:
                    raise SystemExit(f"--without {value}: no such transform in {pipeline!r}")
                pipeline = pipeline.without(value, dependents=True)
                continue
            transform = value if isinstance(value, xp.Transform) else parse_with(value)
            pipeline = pipeline.replace(transform) if transform.name in pipeline else pipeline + transform
        except xp.OrderError as error:
            raise SystemExit(f"--{kind} {value}: {error}") from None
    return pipeline


def select_pipeline(workload: Workload, args: argparse.Namespace) -> xp.Pipeline:
    """``--pipeline`` if given, else the default pipeline changed by the flags."""
    for name in args.imports:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise SystemExit(f"--import {name}: {error}") from None
    if args.pipeline:
        try:
            return xp.Pipeline.from_description(json.loads(args.pipeline))
        except json.JSONDecodeError as error:
            raise SystemExit(
                f"--pipeline is not valid JSON ({error}); give a list of "
                '{"name": ..., "params": {...}} objects'
            ) from None
        except (ValueError, TypeError) as error:
            raise SystemExit(f"--pipeline: {error}") from None
    shorthands = [
        ("with", t)
        for t in (
            xp.accumulate_grad(args.accumulate) if args.accumulate else None,
            xp.clip_grad_norm(args.max_grad_norm) if args.max_grad_norm is not None else None,
            xp.log_every(args.log_every) if args.log_every else None,
        )
        if t is not None
    ]
    return apply_changes(default_pipeline(workload), [*args.changes, *shorthands])


def updates_per_epoch(pipeline: xp.Pipeline, steps: int) -> int:
    """Optimizer updates in an epoch of ``steps`` micro-batches (a last partial window counts)."""
    k = dict(pipeline["accumulate_grad"].params)["steps"] if "accumulate_grad" in pipeline else 1
    return math.ceil(steps / k)


# -- what each replica runs ------------------------------------------------------------


def evaluate(run: xp.Run, workload: Workload) -> float:
    """Accuracy on the "eval" loader: eval mode, no gradients, the precision policy."""
    counts, total = [], 0
    with run.evaluating():
        for batch in run.batches("eval"):
            predicted, labels = workload.predict(run.model, batch)
            counts.append((predicted == labels).sum())
            total += int(labels.shape[0])
    if not total:
        raise ValueError("the eval loader gave no batches: give --eval-size of at least 1")
    return float(torch.stack(counts).sum().item()) / total


def train(
    index: int, setup: xp.TrainingSetup, workload: Workload, args: argparse.Namespace, pipeline: xp.Pipeline
) -> dict[str, Any]:
    """The replica's training function: realise the setup, train, time, evaluate."""
    with xp.session(setup) as run:
        per_epoch = len(run.loaders["train"])
        steps = min(per_epoch, args.max_steps or per_epoch)
        meter = Meter(warmup=args.warmup, on_xla=True)
        epoch_times: list[float] = []
        loss = None
        for epoch in range(args.epochs):
            first_step, warm, start = meter.steps, meter.warm, time.perf_counter()
            for i, batch in enumerate(run.batches("train")):
                if i == steps:
                    break
                loss = run.step(batch, workload.loss_fn)
                meter.tick(run.updated)
            if steps < per_epoch:
                run.end_epoch()  # cut short by --max-steps: apply what was accumulated
            wait_for_device(run.device.type == "xla")
            elapsed = time.perf_counter() - start
            if warm and steps == per_epoch:
                epoch_times.append(elapsed)
            if index == 0:
                print(
                    f"epoch {epoch + 1}/{args.epochs}: {meter.steps - first_step} steps in "
                    f"{elapsed:.1f} s, loss {float(loss):.4f}",
                    flush=True,
                )
        report: dict[str, Any] = meter.report()
        report["final_loss"] = float(loss) if loss is not None else float("nan")
        report["updates"] = run.updates
        if epoch_times:
            report["epoch_s"] = sum(epoch_times) / len(epoch_times)
            report["epoch_s_extrapolated"] = False
        elif report.get("steps_per_s"):
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
    steps = min(len(setup.loaders["train"]), args.max_steps or len(setup.loaders["train"]))
    total = updates_per_epoch(pipeline, steps) * args.epochs
    setup = setup.evolve(scheduler=functools.partial(workload.scheduler, total_steps=total, args=args))
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
    return (
        f"epoch {fmt('epoch_s')} s{extrapolated}, {fmt('steps_per_s')} steps/s, "
        f"{fmt('compiles_total', '.0f')} compilations ({fmt('compiles_after_warmup', '.0f')} after "
        f"warm-up), final loss {fmt('final_loss', '.4f')}, accuracy {fmt('metric')}"
    )
