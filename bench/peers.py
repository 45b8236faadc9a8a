"""One peer's training loop on one workload, in this (fresh) process.

    python -m bench.peers --workload bert --peer accelerate --warmup 3 --steps 20 --out r.json

Peers (each written as its own documentation writes it):

- ``xlapipe``: the default pipeline (with_device, wrap_model_mp, hf_traced_masks
  and static_shapes for text, wrap_loader_mp, set_default_tensor_type) and ``run.step``;
- ``xlapipe+compile``: the same plus ``compile_step(optimizer=True)`` (forward, backward
  and optimizer update compiled); ``xlapipe+compile_fwd``: ``compile_step()`` (forward and
  backward; the default);
- ``xlapipe-no-static``: the default pipeline less static_shapes;
  ``xlapipe-no-hf-masks``: the default pipeline less hf_traced_masks;
- ``accelerate``: ``Accelerator().prepare(model, optimizer, loader)``, then
  ``accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()``
  as its nlp_example does (Accelerate picks the XLA device when torch_xla is
  installed; its prepared optimizer all-reduces the gradients, then steps);
- ``torch_xla``: the hand-written loop of torch_xla's examples:
  ``MpDeviceLoader`` and ``xm.optimizer_step``;
- ``eager``: plain PyTorch on the CPU, no XLA (context).

Every peer is timed by the same :class:`xlapipe.metrics.Meter`, which only
reads torch_xla's counters and the clock. The report (one JSON object) holds
the meter's figures, ``epoch_s`` (the whole epoch, warm-up and compiles
included), the host's time per measured step in the loader's ``next()`` and in
the step (``next_batch_ms``, ``step_ms``), the per-step ``losses`` and the
``loop`` that ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch

from bench import workloads
from bench.workloads import Workload

PEERS = (
    "xlapipe",
    "xlapipe+compile",
    "xlapipe+compile_fwd",
    "xlapipe+xla_compile",
    "xlapipe-no-static",
    "xlapipe-no-hf-masks",
    "xlapipe+bpe4",
    "xlapipe+acc4",
    "xlapipe+acc4+bpe4",
    "accelerate",
    "torch_xla",
    "eager",
)
MISSING = 3  # exit code: an optional peer is not installed


def measure(batches: Iterable, step: Callable[[Any], torch.Tensor], on_xla: bool, warmup: int) -> dict:
    """Run one epoch of ``step`` over ``batches``; the meter's report plus epoch time and losses."""
    from xlapipe.metrics import Meter, wait_for_device

    meter = Meter(warmup=warmup, on_xla=on_xla)
    losses = []
    executions = [_executions(on_xla)]
    host = {"next_batch": 0.0, "step": 0.0}  # after warm-up: time in the loader, time in step()
    batches = iter(batches)
    start = time.perf_counter()
    first_update_s = None
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if meter.steps == 1:  # the first step is traced, compiled and run by now (its marker has passed)
            wait_for_device(on_xla)
            first_update_s = time.perf_counter() - start
            t0 = time.perf_counter()
        if batch is None:
            break
        t1 = time.perf_counter()
        losses.append(step(batch))
        meter.tick()
        if meter.steps > warmup:
            host["next_batch"] += t1 - t0
            host["step"] += time.perf_counter() - t1
        if meter.steps == warmup:
            executions.append(_executions(on_xla))
    report = meter.report()  # waits for the device
    report["epoch_s"] = time.perf_counter() - start
    report["first_update_s"] = first_update_s
    if meter.steps > warmup:
        # On the lazy peers step() is tracing; the device loader's next() holds the step marker.
        report.update({f"{k}_ms": 1000 * v / (meter.steps - warmup) for k, v in host.items()})
    if on_xla and len(executions) == 2 and report.get("measured_steps"):
        # More than one execution per step means something read a value on the host mid-step.
        report["executions_per_step"] = (_executions(on_xla) - executions[1]) / report["measured_steps"]
    report["losses"] = [float(v) for v in losses]
    report["final_loss"] = report["losses"][-1] if losses else float("nan")
    return report


def _executions(on_xla: bool) -> float:
    from xlapipe import metrics

    return metrics.samples("ExecuteTime") if on_xla else 0.0


def default_pipeline(
    work: Workload, compile_step: dict | None = None, static: bool = True, hf_masks: bool = True
):
    """The examples' default pipeline for ``work`` (on this runtime), less or plus what a peer varies."""
    import xlapipe as xp

    workloads.nlp_example()  # puts examples/ on the path
    from _common import default_pipeline as examples_default

    text = work.kind == "text"
    pipeline = examples_default(text=text, transformers=text)
    if text and not static:
        pipeline = pipeline.without("static_shapes")
    if text and not hf_masks:
        pipeline = pipeline.without("hf_traced_masks")
    if compile_step is not None:
        pipeline = pipeline + xp.compile_step(**compile_step)
    return pipeline


def run_xlapipe(work: Workload, loader, seed: int, warmup: int, variant: str) -> dict:
    import xlapipe as xp

    compile_params = {
        "xlapipe+compile": {"optimizer": True},
        "xlapipe+compile_fwd": {},
        "xlapipe+xla_compile": {"backend": "torch_xla", "full_graph": True},
    }.get(variant)
    pipeline = default_pipeline(
        work, compile_params, static=variant != "xlapipe-no-static", hf_masks=variant != "xlapipe-no-hf-masks"
    )
    if "+acc4" in variant:  # one update every 4 micro-batches; the marker on each micro-batch ...
        pipeline = pipeline + xp.accumulate_grad(4)
    if "+bpe4" in variant:  # ... or one marker every 4 batches: 4 steps traced into one graph
        pipeline = pipeline.replace(xp.wrap_loader_mp(batches_per_execution=4))
    setup = xp.TrainingSetup(
        work.build_model(seed), lambda p: workloads.optimizer(work, p), {"train": loader}
    )
    with xp.session(pipeline(setup)) as run:
        run.model.train()
        report = measure(run.loaders["train"], lambda b: run.step(b, work.loss), True, warmup)
    report["loop"] = f"xlapipe {pipeline!r}; run.step(batch, loss_fn)"
    report["pipeline_description"] = pipeline.describe()
    return report


def run_torch_xla(work: Workload, loader, seed: int, warmup: int) -> dict:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    model = work.build_model(seed).to(device)
    optimizer = workloads.optimizer(work, model.parameters())
    train_loader = pl.MpDeviceLoader(loader, device)
    model.train()

    def step(batch: Any) -> torch.Tensor:
        optimizer.zero_grad()
        loss = work.loss(model, batch)
        loss.backward()
        xm.optimizer_step(optimizer)
        return loss.detach()

    report = measure(train_loader, step, True, warmup)
    report["loop"] = "model.to(device); MpDeviceLoader; zero_grad, loss.backward(), xm.optimizer_step"
    return report


def run_accelerate(work: Workload, loader, seed: int, warmup: int) -> dict:
    try:
        import accelerate
        from accelerate import Accelerator
    except ImportError:
        print("accelerate is not installed: pip install 'xlapipe[bench]'", file=sys.stderr)
        sys.exit(MISSING)
    accelerator = Accelerator()
    model = work.build_model(seed).to(accelerator.device)
    optimizer = workloads.optimizer(work, model.parameters())
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, loader)
    model.train()

    def step(batch: Any) -> torch.Tensor:
        loss = work.loss(model, batch)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    report = measure(train_loader, step, accelerator.device.type == "xla", warmup)
    report["loop"] = (
        f"accelerate {accelerate.__version__} on {accelerator.device} "
        f"({accelerator.distributed_type}): prepare(model, optimizer, loader); "
        "accelerator.backward, optimizer.step, optimizer.zero_grad"
    )
    return report


def run_eager(work: Workload, loader, seed: int, warmup: int) -> dict:
    model = work.build_model(seed)
    optimizer = workloads.optimizer(work, model.parameters())
    model.train()

    def step(batch: Any) -> torch.Tensor:
        optimizer.zero_grad()
        loss = work.loss(model, batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    report = measure(loader, step, False, warmup)
    report["loop"] = f"eager PyTorch on the CPU ({torch.get_num_threads()} threads)"
    return report


def run(peer: str, workload: str, warmup: int, steps: int, seed: int, smoke: bool) -> dict:
    """Build the workload, run ``peer`` on it, return its report."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    work = workloads.get(workload, smoke=smoke)
    loader = workloads.loader(work, warmup + steps, seed)
    if peer.startswith("xlapipe"):
        report = run_xlapipe(work, loader, seed, warmup, peer)
    elif peer == "torch_xla":
        report = run_torch_xla(work, loader, seed, warmup)
    elif peer == "accelerate":
        report = run_accelerate(work, loader, seed, warmup)
    else:
        report = run_eager(work, loader, seed, warmup)
    report.update(peer=peer, workload=workload, warmup=warmup, seed=seed, pid=os.getpid())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", required=True, choices=("bert", "varlen", "hostbound"))
    parser.add_argument("--peer", required=True, choices=PEERS)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="measured steps after warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="toy-sized model (for tests)")
    parser.add_argument("--out", required=True, help="write the report (JSON) here")
    opts = parser.parse_args(argv)
    if opts.peer != "eager":
        from xlapipe import runtime

        runtime.ensure_pjrt_device()
    try:
        report = run(opts.peer, opts.workload, opts.warmup, opts.steps, opts.seed, opts.smoke)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        return 1
    with open(opts.out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
