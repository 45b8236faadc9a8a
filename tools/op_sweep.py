"""Every op of PyTorch's OpInfo database on the XLA device, against eager PyTorch on the CPU.

    .venv/bin/python tools/op_sweep.py --out results/op-sweep          # make opsweep (about 5 minutes)
    .venv/bin/python tools/op_sweep.py --only nn.functional.elu amax --corrected

For each OpInfo that takes float32 (random ops and ones that return uninitialised
memory left out), up to ``--samples`` of its sample inputs run on the CPU and on
the XLA device; the outputs are compared (``torch.testing.assert_close``,
rtol 1e-4, atol 1e-5, NaN equal to NaN), and so are the input gradients of the
sum of each float output times a fixed random weight. torch_xla's CPU fallbacks
are recorded, forward and backward. Ops run in child processes, a slice at a
time (xlapipe's one runner); one that crashes its process or runs past
``--op-timeout`` is recorded as such and the sweep goes on after it.

``--corrected`` runs with the kernels xlapipe's sessions install
(:mod:`xlapipe.kernel_fixes`: with_device's, and compile_step's for the graphs
dynamo compiles): what is left is what a session still gets wrong.

Writes ``results.jsonl`` (one line per op; a rerun resumes) and ``summary.md``
(counts, then every op whose forward or gradient differs, with its first
difference) to ``--out``. A mismatch is a lead, not a verdict: a result with
several right answers (eigenvector signs, ties) differs too; docs/testing.md
says which ones were confirmed by hand and what xlapipe does about them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlapipe import child_process  # noqa: E402  (the repository's, however the tool is started)

RTOL, ATOL, SEED = 1e-4, 1e-5, 1234
RANDOM = re.compile(
    r"dropout|rand|normal|bernoulli|multinomial|uniform|exponential|geometric|cauchy|log_normal"
)
NOT_RANDOM = {"nn.functional.normalize", "masked.normalize", "signal.windows.exponential", "__rand__"}
ALSO_RANDOM = {
    "nn.functional.rrelu",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "svd_lowrank",
    "pca_lowrank",
}


def name_of(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def left_out(op: Any) -> str | None:
    """Why ``op`` is not compared (None: it is)."""
    import torch

    name = name_of(op)
    if "empty" in op.name:
        return "uninitialised memory"
    if (RANDOM.search(name) and name not in NOT_RANDOM) or name in ALSO_RANDOM:
        return "random"
    if torch.float32 not in op.supported_dtypes("cpu"):
        return "no float32"
    return None


def difference(want: Any, got: Any) -> str | None:
    """None when ``got`` (XLA's, on the CPU) is ``want`` within the tolerance; else the first difference."""
    import torch

    if isinstance(want, torch.Tensor) != isinstance(got, torch.Tensor):
        return f"a {type(got).__name__} for a {type(want).__name__}"
    if isinstance(want, torch.Tensor) and want.shape != got.shape:
        return f"shape {tuple(got.shape)} for {tuple(want.shape)}"
    try:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, equal_nan=True, check_dtype=False)
        return None
    except AssertionError:
        pass
    if not isinstance(want, torch.Tensor):
        return f"{got!r} for {want!r}"
    a, b = want.double().flatten(), got.double().flatten()
    bad = (~torch.isclose(b, a, rtol=RTOL, atol=ATOL, equal_nan=True)).nonzero().flatten().tolist()
    at = bad[:3]
    return (
        f"{len(bad)} of {a.numel()} elements differ, e.g. at {at}: eager {[a[i].item() for i in at]}, "
        f"XLA {[b[i].item() for i in at]}"
    )


def run_sample(op: Any, sample: Any, device: Any) -> dict[str, Any]:
    """The outputs and input gradients of ``op`` on ``sample`` moved to ``device``, on the CPU."""
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch.utils._pytree import tree_flatten, tree_map

    def moved(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            copy = t.detach().clone().to(device)
            return copy.requires_grad_(t.requires_grad)
        return torch.device(device) if isinstance(t, torch.device) else t

    inp, args, kwargs = tree_map(moved, (sample.input, sample.args, sample.kwargs))
    leaves = [
        t for t in tree_flatten((inp, args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    xla = str(device) != "cpu"
    met.clear_all()
    out = op(inp, *args, **kwargs)
    if xla:
        torch_xla.sync()
    done: dict[str, Any] = {
        "outputs": [o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in tree_flatten(out)[0]],
        "fallbacks": sorted(met.executed_fallback_ops()) if xla else [],
    }
    if not (op.supports_autograd and leaves):
        return done
    shown = sample.output_process_fn_grad(out) if sample.output_process_fn_grad else out
    weights = torch.Generator().manual_seed(SEED)
    terms = [
        (o * torch.randn(o.shape, generator=weights, dtype=o.dtype).to(o.device)).sum()
        for o in tree_flatten(shown)[0]
        if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point
    ]
    if terms:
        met.clear_all()
        grads = torch.autograd.grad(sum(terms), leaves, allow_unused=True)
        if xla:
            torch_xla.sync()
        done["grads"] = [
            torch.zeros(t.shape) if g is None else g.detach().cpu() for t, g in zip(leaves, grads)
        ]
        done["backward_fallbacks"] = sorted(met.executed_fallback_ops()) if xla else []
    return done


def compare(op: Any, samples: int) -> dict[str, Any]:
    """One op's record: ``status`` (match, mismatch, error, cpu error, left out) and its samples'."""
    import torch
    import torch_xla

    why = left_out(op)
    if why is not None:
        return {"status": "left out", "why": why}
    torch.manual_seed(SEED)
    every = list(op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd))
    n = len(every)
    chosen = sorted({0, n // 2, n - 1})[:samples] if n > samples else range(n)  # first, middle, last
    records = []
    for sample in (every[i] for i in chosen):
        try:
            want = run_sample(op, sample, "cpu")
        except Exception as error:  # PyTorch itself refuses it (a CUDA-only op)
            records.append({"status": "cpu error", "error": _first_line(error)})
            continue
        try:
            got = run_sample(op, sample, torch_xla.device())
        except Exception as error:
            records.append({"status": "error", "error": _first_line(error)})
            continue
        found = [
            f"output {i}: {d}"
            for i, (w, g) in enumerate(zip(want["outputs"], got["outputs"]))
            if (d := difference(w, g))
        ]
        if len(want["outputs"]) != len(got["outputs"]):
            found.append(f"{len(got['outputs'])} outputs for {len(want['outputs'])}")
        found += [
            f"gradient {i}: {d}"
            for i, (w, g) in enumerate(zip(want.get("grads", []), got.get("grads", [])))
            if (d := difference(w, g))
        ]
        records.append(
            {
                "status": "mismatch" if found else "match",
                "differences": found,
                "fallbacks": got["fallbacks"],
                "backward_fallbacks": got.get("backward_fallbacks", []),
            }
        )
    statuses = {r["status"] for r in records}
    status = next((s for s in ("mismatch", "error", "match", "cpu error") if s in statuses), "no samples")
    return {"status": status, "samples": records}


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def child(out: Path, start: int, end: int, only: list[str], samples: int, corrected: bool) -> None:
    """Compare op_db[start:end] (or the ``only`` ones), appending a record per op to results.jsonl."""
    import torch_xla
    from torch.testing._internal.common_methods_invocations import op_db

    torch_xla.device()  # before autograd's engine first runs: it sizes its device queues once

    if corrected:
        from xlapipe import kernel_fixes
        from xlapipe.transforms.compile_step import CorrectNativeDropout
        from xlapipe.transforms.device import KERNEL_FIXES

        for fix in (*KERNEL_FIXES, CorrectNativeDropout(), kernel_fixes.DecomposeForAutograd()):
            fix.apply()
    for i in (i for i in range(start, end) if not only or name_of(op_db[i]) in only):
        (out / "progress").write_text(f"{i} {name_of(op_db[i])}")
        began = time.monotonic()
        record = {"index": i, "op": name_of(op_db[i]), **compare(op_db[i], samples)}
        record["seconds"] = round(time.monotonic() - began, 2)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")


def sweep(out: Path, only: list[str], samples: int, corrected: bool, op_timeout: float, slice_: int) -> None:
    """Run the children until every op has a record (a crashed or stuck op gets one saying so)."""
    from torch.testing._internal.common_methods_invocations import op_db

    total = len(op_db)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(ROOT)}
    while True:
        done = {r["index"] for r in load(out)}
        todo = [i for i, op in enumerate(op_db) if i not in done and (not only or name_of(op) in only)]
        if not todo:
            return
        start = todo[0]
        end = next((i for i in range(start, total) if i in done or i - start >= slice_), total)
        progress = out / "progress"
        progress.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            str(start),
            str(end),
            "--out",
            str(out),
            "--samples",
            str(samples),
        ]
        cmd += [*(["--only", *only] if only else []), *(["--corrected"] if corrected else [])]

        def stuck(progress: Path = progress) -> bool:
            return progress.exists() and time.time() - progress.stat().st_mtime > op_timeout

        outcome = child_process.run(cmd, log=out / "child.log", env=env, stop_when=stuck)
        if outcome.status != "ended":  # the op it was at crashed or hung: recorded, and the sweep goes on
            index, _, name = (
                progress.read_text().partition(" ") if progress.exists() else (str(start), "", "?")
            )
            if int(index) not in {r["index"] for r in load(out)}:
                why = "hung" if outcome.status == "stopped" else f"crashed its process ({outcome.returncode})"
                with open(out / "results.jsonl", "a") as f:
                    f.write(
                        json.dumps({"index": int(index), "op": name, "status": "error", "error": why}) + "\n"
                    )
        print(f"op_sweep: {len({r['index'] for r in load(out)})} of {total} ops", flush=True)


def load(out: Path) -> list[dict[str, Any]]:
    path = out / "results.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def summary(out: Path, corrected: bool) -> str:
    records = load(out)
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [
        "# torch_xla against eager PyTorch, op by op (tools/op_sweep.py)",
        "",
        f"{len(records)} OpInfos; "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + (" (with xlapipe's kernel fixes in force)" if corrected else ""),
        "",
        "| op | first difference | CPU fallbacks (forward; backward) |",
        "|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: r["op"]):
        for s in r.get("samples", []):
            if s["status"] == "mismatch":
                fallbacks = f"{', '.join(s['fallbacks']) or '-'}; {', '.join(s['backward_fallbacks']) or '-'}"
                lines.append(f"| `{r['op']}` | {s['differences'][0]} | {fallbacks} |")
                break
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/op_sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/op-sweep", help="folder of results.jsonl and summary.md")
    parser.add_argument("--only", nargs="+", default=[], metavar="OP", help="these OpInfo names only")
    parser.add_argument("--samples", type=int, default=3, help="sample inputs per op (first, middle, last)")
    parser.add_argument("--corrected", action="store_true", help="with xlapipe's kernel fixes in force")
    parser.add_argument("--op-timeout", type=float, default=120.0, help="seconds one op may take")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    if opts.child:
        child(out, *opts.child, opts.only, opts.samples, opts.corrected)
        return 0
    sweep(out, opts.only, opts.samples, opts.corrected, opts.op_timeout, slice_=60)
    (out / "summary.md").write_text(summary(out, opts.corrected))
    print(f"op_sweep: {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
