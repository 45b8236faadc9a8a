"""The doctor's side inside the script's process: run the script unchanged and note what XLA does.

``xlapipe doctor`` runs this file in the script's process (see ``BOOT``), without
importing xlapipe there, so a plain torch_xla script stays plain. It runs the script as ``python SCRIPT ARGS`` would (its folder
first on ``sys.path``, ``__name__ == "__main__"``, its own ``sys.argv``) and,
when the script imports torch_xla, instruments it:

- every step marker (``torch_xla.sync``, which ``xm.mark_step``, the device
  loader, ``xm.optimizer_step(barrier=True)`` and xlapipe's ``run.step`` call)
  is counted and timed, with the counters torch_xla keeps; after N steps the
  probe says so and waits for the doctor to stop the process;
- a torch function mode at the bottom of the mode stack (the *watcher*) notes
  every call that copies a device value to the host, falls back to the CPU or
  copies a host tensor to the device outside the loader, with the caller's stack;
- the loaders' ``__next__`` (time waiting for a batch), the optimizers' step and
  the modules' forward (parameters' dtype, autocast) are noted by hooks;
- deprecated calls (``xm.mark_step``, ``xm.xla_device``,
  ``torch.set_default_tensor_type``) are noted with their caller.

torch_xla writes its own account (``PT_XLA_DEBUG_LEVEL=2``: every compilation
and execution with its cause and Python frames; ``XLA_SAVE_TENSORS_FILE``: every
graph's IR) to files of this run's folder; the probe appends its records, one
``xlapipe-doctor {json}`` line each, to the same per-process file, so one file
holds every event in order. When the script ends, everything is restored.

Mode ``count`` (the doctor's overhead baseline) only counts and times step markers.
"""

from __future__ import annotations

import faulthandler
import importlib.abc
import importlib.util
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

PREFIX = "xlapipe-doctor "
DIR_ENV = "XLAPIPE_DOCTOR_DIR"  # the run's folder: traces, graphs, stacks
STEPS_ENV = "XLAPIPE_DOCTOR_STEPS"  # stop after this many steps
MODE_ENV = "XLAPIPE_DOCTOR_MODE"  # "diagnose" (default) or "count"
TRACE = "trace-{pid}.txt"
GRAPHS = "graphs-{pid}.txt"  # torch_xla appends ".<ordinal>"
STACKS = "stacks-{pid}.txt"
MAX_FRAMES = 64  # torch_xla's frames per analysis
STACK_FRAMES = 256  # the probe's frames per record: a transformers model's stack is deeper than 64
WAIT_AFTER_LIMIT_S = 300.0  # the doctor kills the process long before


def _env() -> dict[str, str]:
    """The torch_xla switches for this process (read once, when its runtime starts)."""
    folder, pid = os.environ[DIR_ENV], os.getpid()
    env = {}
    if os.environ.get(MODE_ENV, "diagnose") == "diagnose":
        env = {
            "PT_XLA_DEBUG_LEVEL": "2",
            "PT_XLA_DEBUG_MAX_FRAME": str(MAX_FRAMES),
            "PT_XLA_DEBUG_FILE": os.path.join(folder, TRACE.format(pid=pid)),
            "XLA_SAVE_TENSORS_FILE": os.path.join(folder, GRAPHS.format(pid=pid)),
            "XLA_SAVE_TENSORS_FMT": "text",
            "XLA_IR_DEBUG": "1",
        }
    return env


class _Probe:
    """Per-process state; a forked child starts afresh (its own files, no steps yet)."""

    def __init__(self) -> None:
        self.folder = os.environ[DIR_ENV]
        self.steps = int(os.environ.get(STEPS_ENV, "0") or 0)
        self.diagnose = os.environ.get(MODE_ENV, "diagnose") == "diagnose"
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()  # anew in a forked child: another thread may have held it
        self.training: int | None = None  # the thread whose step markers count
        self.local = threading.local()
        self.batches: deque = deque(maxlen=4)  # (ids of a batch's tensors, the batch)
        self.seen_sites: set = set()
        self.free_updates = 0  # optimizer steps before any step marker ran a graph
        self.first_module: Any = None  # a weak reference to the module of the first forward pass
        self.numbers: dict = {}  # (site, function) -> the Python numbers of its last call
        self.value_notes = 0
        self.forward_noted: set[str] = set()  # torch functions whose backward falls back, noted once
        self.wrong_noted: set = set()  # (function, site) of calls torch_xla computes wrong, noted once
        self.batch_kinds: set[tuple[str, str]] = set()  # (batch type, loader type), each noted once
        os.environ.update(_env())

    def write(self, kind: str, **fields: Any) -> None:
        with self.lock:
            append(self.folder, kind, **fields)

    def thread_state(self) -> Any:
        state = self.local
        if not hasattr(state, "markers"):
            state.markers = 0  # markers that ran a graph (steps)
            state.last = time.perf_counter()
            state.wait_s = 0.0  # waiting for batches since the last step
            state.sync_s = 0.0  # inside step markers (excluded from waits)
            state.updates = 0
            state.compiled_runs = 0  # graphs torch.compile (dynamo) ran since the last step
            state.compiles = 0.0  # CompileTime samples up to the last step
            state.loader_stack = None  # where the last batch was asked for
            state.queued = None  # the device loader's queues when it was asked (see _queued)
            state.stopped = False
        return state


PROBE: _Probe | None = None


def append(folder: str, kind: str, **fields: Any) -> None:
    """Append one record to this process's trace file in ``folder``."""
    record = {"kind": kind, "pid": os.getpid(), "thread": threading.get_ident(), **fields}
    line = PREFIX + json.dumps(record, default=str) + "\n"
    with open(os.path.join(folder, TRACE.format(pid=os.getpid())), "a", encoding="utf-8") as f:
        f.write(line)


def stack(skip: int = 1) -> list[list[Any]]:
    """The caller's frames, innermost first, as [file, line, function]; the probe's own left out."""
    out: list[list[Any]] = []
    frame: Any = sys._getframe(skip)
    while frame is not None and len(out) < STACK_FRAMES:
        code = frame.f_code
        if code.co_filename != __file__ and code not in TRAMPOLINE_CODES:
            out.append([code.co_filename, frame.f_lineno, code.co_name])
        frame = frame.f_back
    return out


# -- torch_xla's counters ---------------------------------------------------------------------------


def _counters() -> dict[str, float]:
    """Graphs compiled and taken from the cache, and the compile time: what a step marker ran.

    (ExecuteTime and the transfer metrics are left out: each keeps a thousand samples, and
    copying them at every marker costs more than a tiny model's step.)
    """
    import torch_xla.debug.metrics as met

    out = {name: float(met.counter_value(name) or 0) for name in ("UncachedCompile", "CachedCompile")}
    data = met.metric_data("CompileTime")
    out["CompileTime.count"], out["CompileTime.s"] = (float(data[0]), data[1] / 1e9) if data else (0.0, 0.0)
    return out


def _metric(name: str) -> Any:
    import torch_xla.debug.metrics as met

    return met.metric_data(name)


def _fallbacks() -> dict[str, float]:
    """torch_xla's per-op counters of ops that ran on the CPU (``aten::...``)."""
    import torch_xla.debug.metrics as met

    return {n: float(met.counter_value(n) or 0) for n in met.counter_names() if n.startswith("aten::")}


def _compile_samples(count: float, before: float) -> list[float]:
    """The seconds of the compilations since ``before`` (torch_xla keeps the last samples)."""
    import torch_xla.debug.metrics as met

    new = int(count - before)
    data = met.metric_data("CompileTime")
    if new <= 0 or not data:
        return []
    return [value / 1e9 for _, value in data[2][-new:]]


# -- step markers -------------------------------------------------------------------------------------


def _marker(real: Callable[..., Any]) -> Callable[..., Any]:
    def sync(*args: Any, **kwargs: Any) -> Any:
        probe = PROBE
        if probe is None:
            return real(*args, **kwargs)
        state = probe.thread_state()
        if state.stopped or _inside_dynamo():
            return real(*args, **kwargs)
        if probe.diagnose and not _watched():
            _watch_this_thread(state)
        begin = time.perf_counter()
        before = _counters()
        if probe.diagnose:
            probe.write(
                "marker",
                n=state.markers + 1,
                stack=stack(2),
                host_s=begin - state.last,
                wait_s=state.wait_s,
                updates=state.updates,
                counters=before,
                fallbacks=_fallbacks(),
            )
        try:
            return real(*args, **kwargs)
        finally:
            end = time.perf_counter()
            after = _counters()
            ran = (
                after["UncachedCompile"] + after["CachedCompile"]
                > before["UncachedCompile"] + before["CachedCompile"]
            )
            ran = ran or state.compiled_runs > 0  # the step ran as graphs torch.compile made
            state.sync_s += end - begin
            if ran and probe.training is None:
                probe.training = threading.get_ident()
                _note_runtime(probe)
            counted = ran and probe.training == threading.get_ident()
            if counted:
                state.markers += 1
            probe.write(
                "marker_end",
                n=state.markers,
                ran=ran,
                step=counted,
                sync_s=end - begin,
                step_s=end - state.last,
                wait_s=state.wait_s,
                updates=state.updates,
                counters=after,
                compile_s=_compile_samples(after["CompileTime.count"], state.compiles),
                loader_stack=state.loader_stack,
                queued=state.queued,
            )
            if counted:
                state.last, state.wait_s, state.updates, state.compiled_runs = end, 0.0, 0, 0
                state.compiles = after["CompileTime.count"]
            if counted and probe.steps and state.markers >= probe.steps:
                state.stopped = True
                probe.write("limit", steps=state.markers)
                _wait_to_be_stopped()

    sync.__wrapped__ = real  # type: ignore[attr-defined]
    return sync


def _inside_dynamo() -> bool:
    """torch_xla's dynamo bridge syncs while it compiles a region: its own business, not a step."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        if "_dynamo" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _wait_to_be_stopped() -> None:
    """N steps done: the doctor stops the process; nothing of the script runs meanwhile."""
    deadline = time.monotonic() + WAIT_AFTER_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(3)


def _note_runtime(probe: _Probe) -> None:
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    info: dict[str, Any] = {
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "backend": "torch_xla",
        "versions": {"torch": torch.__version__, "torch_xla": getattr(torch_xla, "__version__", "?")},
    }
    try:
        info["device_type"] = xr.device_type()
        info["devices"] = xr.addressable_runtime_device_count()
        info["world_size"] = xr.world_size()
        info["rank"] = xr.global_ordinal()
    except Exception as error:  # noqa: BLE001 - what the runtime could not say is reported as such
        info["error"] = repr(error)
    names = ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_USE_BF16", "XLA_DOWNCAST_BF16", "XLA_USE_FP16")
    info["env"] = {n: os.environ[n] for n in names if n in os.environ}
    probe.write("runtime", **info)


# -- the watcher: device values read on the host, CPU fallbacks, transfers outside the loader ---------


_READS = frozenset(
    "item tolist numpy cpu __float__ __int__ __bool__ __index__ __repr__ __format__ __str__ __array__".split()
)


def _counter(name: str) -> float:
    import torch_xla

    return float(torch_xla._XLAC._xla_counter_value(name) or 0)


class _Ids:
    """Ids of the tensors of the batches the loaders handed out last."""

    @staticmethod
    def of(batch: Any, depth: int = 0) -> set[int]:
        import torch

        if isinstance(batch, torch.Tensor):
            return {id(batch)}
        out: set[int] = set()
        if depth > 3:
            return out
        if isinstance(batch, dict) or hasattr(batch, "items"):
            try:
                values = list(batch.values())
            except Exception:  # noqa: BLE001 - not a mapping after all
                values = []
        elif isinstance(batch, (list, tuple)):
            values = list(batch)
        else:
            values = list(getattr(batch, "__dict__", {}).values())
        for value in values:
            out |= _Ids.of(value, depth + 1)
        return out


def _watcher_class() -> type:
    import torch
    from torch.overrides import TorchFunctionMode

    compiling = torch.compiler.is_compiling

    class Watcher(TorchFunctionMode):
        """Notes the calls that move data between the host and the device (see the module doc)."""

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if compiling():  # dynamo tracing a compiled region: nothing runs now, nothing to note
                return func(*args, **kwargs)
            probe = PROBE
            if probe is None:
                return func(*args, **kwargs)
            to_cpu, copy_from = _counter("xla::_to_cpu"), _counter("xla::_copy_from")
            compiles, cached = _counter("UncachedCompile"), _counter("CachedCompile")
            site = _user_site(sys._getframe(1))
            name = getattr(func, "__name__", str(func))
            if probe.diagnose:
                _note_numbers(probe, site, name, args, kwargs)
                if name in WRONG_ON_XLA and (name, site) not in probe.wrong_noted:
                    _note_wrong(probe, site, name, args, kwargs)
                forward = _backward_on_cpu(name, args, kwargs) if name in BACKWARD_NAMES else None
                if forward is not None and forward not in probe.forward_noted:
                    probe.forward_noted.add(forward)  # the IR's location is inside torch: the user's line
                    probe.write("forward_op", op=forward, stack=[[site[0], site[2], site[1]]])
            begin = time.perf_counter()
            out = _trampoline_for(site)(func, args, kwargs)
            spent = time.perf_counter() - begin
            read = _counter("xla::_to_cpu") > to_cpu or (
                (
                    name in _READS
                    or (name == "to" and isinstance(out, torch.Tensor) and out.device.type == "cpu")
                )
                and any(_on_xla(a) for a in args)
            )
            if read:
                _note_read(probe, name, spent, compiles, cached)
            elif _counter("xla::_copy_from") > copy_from and _on_xla(out):
                _note_transfer(probe, name, args, spent)
            return out

    return Watcher


# -- the line torch_xla's IR names (``XLA_IR_DEBUG``): the user's, not the watcher's -------------------
#
# torch_xla gives each IR op the innermost Python frame as its location; under the watcher that frame
# is the watcher's. So the watcher calls ``func`` through a one-line function whose code is named
# after the innermost frame of the user's code (file, function, line): the op's location is then
# the user's line that traced it, as the doctor reports lines. One such function per line, made once.


def _trampoline(f: Any, a: Any, k: Any) -> Any:
    return f(*a, **k)


TRAMPOLINES: dict[tuple[str, str, int], Callable[..., Any]] = {}
TRAMPOLINE_CODES: set[Any] = set()
USER_FILES: dict[str, bool] = {}  # co_filename -> whether it is the user's code
LIBRARY_DIRS: tuple[str, ...] = ()


def _is_user(filename: str) -> bool:
    known = USER_FILES.get(filename)
    if known is None:
        if filename.startswith("<"):
            known = filename in ("<stdin>", "<string>")
        else:
            known = not os.path.realpath(filename).startswith(LIBRARY_DIRS)
        USER_FILES[filename] = known
    return known


# Torch functions whose forward XLA lowers and whose backward op it does not (it runs on the CPU), by
# their forward op; measured with torch_xla 2.9 (executed_fallback_ops after a backward).
BACKWARD_ON_CPU = {"glu": "aten::glu", "pdist": "aten::_pdist", "cdist": "aten::_cdist"}
INTERPOLATE_BACKWARD_ON_CPU = {"bilinear": "aten::upsample_bilinear2d", "nearest": "aten::upsample_nearest2d"}
BACKWARD_NAMES = {*BACKWARD_ON_CPU, "interpolate"}  # checked first: the watcher sees every torch call


def _backward_on_cpu(name: str, args: Any, kwargs: Any) -> str | None:
    """The forward op of a call in :data:`BACKWARD_ON_CPU` (``F.interpolate``: by its ``mode``)."""
    if name == "interpolate":
        mode = args[3] if len(args) > 3 else kwargs.get("mode", "nearest")
        return INTERPOLATE_BACKWARD_ON_CPU.get(mode) if isinstance(mode, str) else None
    return BACKWARD_ON_CPU.get(name)


# Torch functions torch_xla 2.9 computes wrong without a word (the check's module doc says how, and when),
# each with the kernel xlapipe.kernel_fixes corrects while a session with with_device lasts (None: none).
WRONG_ON_XLA: dict[str, str | None] = {
    "elu": "elu_backward",
    "celu": "elu_backward",
    "selu": "elu_backward",
    "norm": "norm.Scalar",
    "amax": "amax",
    "amin": "amin",
    "sum": "sum.dim_IntList",
    "mean": "mean.dim",
    "var": "var.correction",
    "std": "std.correction",
    "diagonal": "diagonal_copy",
    "interpolate": "upsample_nearest2d",
    "svd": "_linalg_svd",
    "linalg_svd": "_linalg_svd",
}


def _argument(args: Any, kwargs: Any, index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _computed_wrong(name: str, x: Any, args: Any, kwargs: Any) -> bool:
    """Whether torch_xla 2.9 gets this call on the XLA tensor ``x`` wrong (measured for each case)."""
    import torch

    if name == "norm":  # p = inf or -inf
        p = _argument(args, kwargs, 1, "p", "fro")
        return isinstance(p, (int, float)) and abs(p) == float("inf")
    if name in ("elu", "celu", "selu"):  # the gradient only
        return torch.is_grad_enabled() and bool(x.requires_grad)
    if name in ("amax", "amin"):  # no dimension given: every dimension
        dim = _argument(args, kwargs, 1, "dim", ())
        return x.dim() > 0 and (dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0))
    if name in ("sum", "mean", "var", "std"):  # an empty dimension list given
        dim = _argument(args, kwargs, 1, "dim")
        return x.dim() > 0 and isinstance(dim, (tuple, list)) and len(dim) == 0
    if name == "diagonal":  # dims 0 and 1 of a tensor of 3 or more
        dims = (_argument(args, kwargs, 2, "dim1", 0), _argument(args, kwargs, 3, "dim2", 1))
        rank = x.dim()
        return (
            rank >= 3 and all(isinstance(d, int) for d in dims) and (dims[0] % rank, dims[1] % rank) == (0, 1)
        )
    if name == "interpolate":  # a scale that does not give whole sizes, nearest or bilinear, 2-D
        scale = _argument(args, kwargs, 2, "scale_factor")
        mode = _argument(args, kwargs, 3, "mode", "nearest")
        corners = _argument(args, kwargs, 4, "align_corners")
        if scale is None or x.dim() != 4 or _argument(args, kwargs, 5, "recompute_scale_factor"):
            return False
        if mode not in ("nearest", "bilinear") or (mode == "bilinear" and corners):
            return False
        scales = scale if isinstance(scale, (tuple, list)) else (scale, scale)
        return any(float(n * s) != int(n * s) for n, s in zip(x.shape[-2:], scales))
    if name in ("svd", "linalg_svd"):  # batched: V comes back with its batch dimension last
        return bool(x.dim() >= 3)
    return False


def _note_wrong(probe: _Probe, site: tuple[str, str, int], name: str, args: Any, kwargs: Any) -> None:
    """Note a call on the XLA device whose result torch_xla gets wrong, unless xlapipe's corrected kernel
    is in force."""
    first = args[0] if args else kwargs.get("input")
    if not _on_xla(first) or not _computed_wrong(name, first, args, kwargs):
        return
    fixes, kernel = sys.modules.get("xlapipe.kernel_fixes"), WRONG_ON_XLA[name]
    if fixes is not None and kernel is not None and kernel in getattr(fixes, "_installed", {}):
        return
    probe.wrong_noted.add((name, site))
    probe.write("wrong_op", func=name, stack=[[site[0], site[2], site[1]]])


def _user_site(caller: Any) -> tuple[str, str, int]:
    """(file, function, line) of the innermost user frame from ``caller`` out (else of ``caller``)."""
    frame = caller
    while frame is not None and not _is_user(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame if frame is not None else caller
    code = frame.f_code
    return (code.co_filename, code.co_name, frame.f_lineno or code.co_firstlineno)


def _trampoline_for(key: tuple[str, str, int]) -> Callable[..., Any]:
    """The function to call ``func`` through: its code named after the user's line ``key``."""
    made = TRAMPOLINES.get(key)
    if made is None:
        names: dict[str, Any] = {
            "co_filename": key[0],
            "co_name": key[1],
            "co_firstlineno": max(key[2] - 1, 0),
        }
        if sys.version_info >= (3, 11):
            names["co_qualname"] = key[1]  # what 3.11's tracebacks show
        renamed = _trampoline.__code__.replace(**names)  # its call is on the line after its def
        TRAMPOLINE_CODES.add(renamed)
        made = TRAMPOLINES[key] = types.FunctionType(renamed, {"__builtins__": __builtins__})
    return made


# -- Python numbers passed to torch calls: one that changes between steps may be baked into the graph --

VALUE_NOTES = 400  # "value" records per process, at most
_NUMBER_TYPES = (int, float)


def _numbers(args: Any, kwargs: Any) -> tuple:
    """The Python numbers among a call's arguments (in lists, tuples and slices too), with their place."""
    out: list[tuple[Any, Any]] = []
    for place, value in (*enumerate(args), *kwargs.items()):
        if isinstance(value, bool):
            continue
        if isinstance(value, _NUMBER_TYPES):
            out.append((place, value))
        elif isinstance(value, slice):
            out.append((place, (value.start, value.stop, value.step)))
        elif isinstance(value, (list, tuple)) and value and len(value) <= 8:
            inner = tuple(v if isinstance(v, _NUMBER_TYPES) else None for v in value)
            if any(v is not None for v in inner):
                out.append((place, inner))
    return tuple(out)


def _note_numbers(probe: _Probe, site: tuple[str, str, int], name: str, args: Any, kwargs: Any) -> None:
    numbers = _numbers(args, kwargs)
    if not numbers or not any(_on_xla(a) for a in args):
        return  # a call on host tensors (a dataset's indexing) builds no graph
    key = (site, name)
    last = probe.numbers.get(key)
    probe.numbers[key] = numbers
    if last is not None and last != numbers and probe.value_notes < VALUE_NOTES:
        probe.value_notes += 1
        probe.write(
            "value",
            func=name,
            stack=[[site[0], site[2], site[1]]],
            before=repr(last)[:200],
            after=repr(numbers)[:200],
            changed=[[str(p), repr(w)] for (p, v), (q, w) in zip(last, numbers) if p == q and v != w][:4],
            step=probe.thread_state().markers,
        )


def _on_xla(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.device.type == "xla"


def _note_read(probe: _Probe, name: str, spent: float, compiles: float, cached: float) -> None:
    state = probe.thread_state()
    fallbacks = _fallbacks()
    before = getattr(state, "fallbacks", {})
    ops = {op: n - before.get(op, 0.0) for op, n in fallbacks.items() if n > before.get(op, 0.0)}
    state.fallbacks = fallbacks
    compiled = _counter("UncachedCompile") - compiles
    data = _metric("CompileTime")
    count = float(data[0]) if data else 0.0
    probe.write(
        "read",
        func=name,
        stack=stack(3),
        spent_s=spent,
        ops=ops,
        # a graph run for it: compiled anew, or taken from the cache
        executions=_counter("UncachedCompile") + _counter("CachedCompile") - compiles - cached,
        compiles=compiled,
        compile_s=sum(_compile_samples(count, count - compiled)),  # within spent_s
    )


_FROM_HOST_DATA = frozenset(("tensor", "as_tensor", "asarray", "from_numpy"))


def _note_transfer(probe: _Probe, name: str, args: Any, spent: float) -> None:
    import torch

    source = next((a for a in args if isinstance(a, torch.Tensor) and a.device.type == "cpu"), None)
    if source is None and name not in _FROM_HOST_DATA:
        return  # a copy on the device (a dtype change), not from the host
    if source is not None and any(id(source) in ids for ids, _ in list(probe.batches)):
        return  # a tensor of a batch a loader handed out: the loader's transfer
    size = source.numel() * source.element_size() if source is not None else None
    probe.write("transfer", func=name, stack=stack(3), spent_s=spent, bytes=size)


def _watched() -> bool:
    from torch._C import _get_function_stack_at, _len_torch_function_stack

    return any(_get_function_stack_at(i) is WATCHER for i in range(_len_torch_function_stack()))


def _watch_this_thread(state: Any) -> None:
    """Put the watcher at the bottom of this thread's mode stack (modes above it keep their order)."""
    from torch._C import _len_torch_function_stack, _pop_torch_function_stack, _push_on_torch_function_stack

    state.fallbacks = _fallbacks()
    above = [_pop_torch_function_stack() for _ in range(_len_torch_function_stack())]
    _push_on_torch_function_stack(WATCHER)
    for mode in reversed(above):
        _push_on_torch_function_stack(mode)


def _unwatch_this_thread() -> None:
    from torch._C import _len_torch_function_stack, _pop_torch_function_stack, _push_on_torch_function_stack

    modes = [_pop_torch_function_stack() for _ in range(_len_torch_function_stack())]
    for mode in reversed(modes):
        if mode is not WATCHER:
            _push_on_torch_function_stack(mode)


WATCHER: Any = None


# -- loaders, optimizers, modules, deprecated calls ----------------------------------------------------


def _timed_next(real: Callable[..., Any]) -> Callable[..., Any]:
    def next_batch(self: Any) -> Any:
        probe = PROBE
        if probe is None:
            return real(self)
        state = probe.thread_state()
        if probe.diagnose:
            state.queued = _queued(self)
        synced, begin = state.sync_s, time.perf_counter()
        try:
            batch = real(self)
        finally:
            state.wait_s += time.perf_counter() - begin - (state.sync_s - synced)
        if probe.diagnose:
            probe.batches.append((_Ids.of(batch), batch))
            state.loader_stack = stack(2)
            kind = ("mapping" if isinstance(batch, Mapping) else type(batch).__name__, type(self).__name__)
            if kind not in probe.batch_kinds:  # what a fix that pads batches can take
                probe.batch_kinds.add(kind)
                probe.write("batch_kind", batch=kind[0], loader=kind[1])
        return batch

    next_batch.__wrapped__ = real  # type: ignore[attr-defined]
    return next_batch


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    import torch

    if torch.compiler.is_compiling():  # an optimizer step compiled by dynamo: traced, not run now
        return
    probe = PROBE
    if probe is None:
        return
    state = probe.thread_state()
    state.updates += 1
    if probe.diagnose and probe.training is None:  # no step marker has run a graph yet
        _update_without_marker(probe, state)
    if not getattr(optimizer, "_xlapipe_doctor_seen", False):
        optimizer._xlapipe_doctor_seen = True
        kinds: dict[str, int] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                key = f"{p.device.type}:{str(p.dtype).replace('torch.', '')}"
                kinds[key] = kinds.get(key, 0) + 1
        probe.write("params", optimizer=type(optimizer).__name__, kinds=kinds)
        _check_optimizer_holds_the_model(probe, optimizer)


def _check_optimizer_holds_the_model(probe: _Probe, optimizer: Any) -> None:
    """An optimizer holding CPU tensors while the model ran on XLA: built before ``model.to(device)``."""
    module = probe.first_module() if probe.first_module is not None else None
    if module is None:
        return
    on_xla = {id(p) for p in module.parameters() if p.device.type == "xla"}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    stale = [p for p in held if p.device.type == "cpu"]
    if not on_xla or not stale or any(id(p) in on_xla for p in held):
        return
    probe.write(
        "stale_optimizer",
        optimizer=type(optimizer).__name__,
        model=type(module).__name__,
        held=len(held),
        cpu=len(stale),
        model_params=len(on_xla),
        step=stack(4),
        built=getattr(optimizer, "_xlapipe_doctor_built", None),
        moved=getattr(module, "_xlapipe_doctor_moved", None),
    )


def _noting_construction(real: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        if PROBE is not None and not hasattr(self, "_xlapipe_doctor_built"):
            self._xlapipe_doctor_built = stack(2)

    __init__.__wrapped__ = real  # type: ignore[attr-defined]
    return __init__


def _noting_move(real: Callable[..., Any]) -> Callable[..., Any]:
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        if PROBE is not None and not hasattr(out, "_xlapipe_doctor_moved"):
            if any(p.device.type == "xla" for p in out.parameters(recurse=True)):
                out._xlapipe_doctor_moved = stack(2)
        return out

    to.__wrapped__ = real  # type: ignore[attr-defined]
    return to


def _update_without_marker(probe: _Probe, state: Any) -> None:
    """An optimizer step before any step marker ran a graph: noted; after N of them, the run is stopped.

    A script with no step marker at all is then diagnosed on its first N updates, not left to run
    to its end with the whole loop traced into one graph.
    """
    probe.free_updates += 1
    if probe.steps and probe.free_updates > probe.steps:  # N updates made: this is the N+1-th
        state.stopped = True
        probe.write("limit", steps=0, updates=probe.free_updates - 1)
        _wait_to_be_stopped()
    probe.write("update", n=probe.free_updates, stack=stack(3), counters=_counters())


def _on_forward(module: Any, inputs: Any) -> None:
    import torch

    if torch.compiler.is_compiling():
        return
    probe = PROBE
    if probe is None:
        return
    if probe.first_module is None:  # the outermost module of the first forward pass: the model
        probe.first_module = weakref.ref(module)
    state = probe.thread_state()
    seen = (torch.is_autocast_enabled("xla"), str(torch.get_autocast_dtype("xla")).replace("torch.", ""))
    if getattr(state, "autocast", None) != seen:
        state.autocast = seen
        probe.write("autocast", enabled=seen[0], dtype=seen[1], module=type(module).__name__)


def _counted_run(real: Callable[..., Any]) -> Callable[..., Any]:
    """torch_xla's runner of the graphs dynamo compiled: each run is work a step marker may end."""

    def run_cached_graph(*args: Any, **kwargs: Any) -> Any:
        if PROBE is not None:
            PROBE.thread_state().compiled_runs += 1
        return real(*args, **kwargs)

    return run_cached_graph


def _deprecated(api: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def noted(*args: Any, **kwargs: Any) -> Any:
        probe = PROBE
        if probe is not None:
            frames = stack(2)
            site = (api, *frames[0][:2]) if frames else (api,)
            if site not in probe.seen_sites:
                probe.seen_sites.add(site)
                probe.write("deprecated", api=api, stack=frames)
        return real(*args, **kwargs)

    noted.__wrapped__ = real  # type: ignore[attr-defined]
    return noted


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    real = getattr(owner, name)
    setattr(owner, name, make(real))
    PROBE_RESTORES.append(lambda: setattr(owner, name, real))


PROBE_RESTORES: list[Callable[[], None]] = []


def _instrument_torch_xla(module: Any) -> None:
    """Runs when the script imports torch_xla: put every probe in place."""
    global WATCHER
    import torch
    import torch_xla.core.xla_model as xm
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torch.utils.data import dataloader

    probe = PROBE
    assert probe is not None
    probe.write("instrumented")
    # ``torch_xla.torch_xla`` as an attribute is the package again (its ``from .torch_xla import *``
    # rebinds the name); ``torch_xla.compile`` and ``torch_xla.step`` call the submodule's ``sync``
    txla = sys.modules["torch_xla.torch_xla"]
    marker = _marker(txla.sync)
    for owner in (module, txla):
        _patch(owner, "sync", lambda real: marker)
    _patch(dataloader._BaseDataLoaderIter, "__next__", _timed_next)
    _patch(module._XLAC, "_run_cached_graph", _counted_run)
    _when_imported("torch_xla.distributed.parallel_loader", _instrument_device_loader)
    if not probe.diagnose:
        return
    _patch(xm, "mark_step", lambda real: _deprecated("xm.mark_step", real))
    _patch(xm, "xla_device", lambda real: _deprecated("xm.xla_device", real))
    _patch(torch, "set_default_tensor_type", lambda real: _deprecated("torch.set_default_tensor_type", real))
    _patch(torch.optim.Optimizer, "__init__", _noting_construction)
    _patch(torch.nn.Module, "to", _noting_move)
    for register in (
        register_optimizer_step_pre_hook(_on_optimizer_step),
        register_module_forward_pre_hook(_on_forward),
    ):
        PROBE_RESTORES.append(register.remove)
    WATCHER = _watcher_class()()
    _watch_this_thread(probe.thread_state())
    PROBE_RESTORES.append(_unwatch_this_thread)


def _queued(loader: Any) -> list[int] | None:
    """[batches ready, room, 1 when the host loader has given its last batch] in the queues of
    torch_xla's device loader ``loader`` takes its next batch from; None for another loader."""
    try:
        per_device = loader._loader._queues[loader._device]
        queues = (per_device.cpu_loader_queue, per_device.queue)
        ready, room = sum(len(q._items) for q in queues), sum(int(q._maxsize) for q in queues)
        return [ready, room, int(bool(per_device.cpu_loader_queue._close_write))]
    except (AttributeError, KeyError, TypeError):
        return None


def _instrument_device_loader(module: Any) -> None:
    _patch(module.PerDeviceLoader, "next", _timed_next)


# -- running something when a module is first imported -----------------------------------------------


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after ``name`` is first imported (its code ran)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real, then, finder = loader.exec_module, self.then, self

        def exec_module(module: Any) -> None:
            del loader.exec_module  # the loader's own method again
            real(module)
            _forget(finder)
            try:
                then(module)
            except Exception as error:  # the doctor's own failure: noted, and the script runs on, unprobed
                _restore()
                if PROBE is not None:
                    PROBE.write("probe_error", error=traceback.format_exc(), message=repr(error))

        loader.exec_module = exec_module
        return spec


def _forget(finder: Any) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def _when_imported(name: str, then: Callable[[Any], None]) -> None:
    if name in sys.modules:
        then(sys.modules[name])
        return
    finder = _AfterImport(name, then)
    sys.meta_path.insert(0, finder)
    PROBE_RESTORES.append(lambda: _forget(finder))


# -- running the script -------------------------------------------------------------------------------


def _restore() -> None:
    while PROBE_RESTORES:
        PROBE_RESTORES.pop()()


def _dump_stacks_on_sigusr1() -> None:
    """``kill -USR1``: every thread's stack to this process's stacks file (the doctor's --timeout)."""
    assert PROBE is not None
    path = os.path.join(PROBE.folder, STACKS.format(pid=os.getpid()))
    STACK_FILES.append(open(path, "w"))  # noqa: SIM115 - open for as long as the process lives
    faulthandler.register(signal.SIGUSR1, file=STACK_FILES[-1], all_threads=True)


STACK_FILES: list[Any] = []


def _after_fork_in_child() -> None:
    if PROBE is not None:
        PROBE.reset()
        _dump_stacks_on_sigusr1()


def _libraries() -> dict[str, list[str]]:
    """Where this interpreter's libraries live: frames there are never the user's line."""
    import site
    import sysconfig

    def package(name: str) -> list[str]:
        spec = importlib.util.find_spec(name)  # a top-level package: found, not imported
        return list(spec.submodule_search_locations or []) if spec else []

    paths = sysconfig.get_paths()
    return {
        # xlapipe's own frames (this file's package) even when the script cannot import xlapipe
        "own": package("torch") + package("torch_xla") + [os.path.dirname(os.path.dirname(__file__))],
        "python": [paths["stdlib"], paths["platstdlib"]],
        "third_party": [
            *site.getsitepackages(),
            site.getusersitepackages(),
            paths["purelib"],
            paths["platlib"],
            # packages found through a .pth file or PYTHONPATH (a venv layered on another's)
            *(
                p
                for p in sys.path
                if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")
            ),
        ],
    }


def _without_probe(tb: Any) -> Any:
    """A traceback without the probe's frames (the watcher's, the trampolines'), as python shows it."""
    kept = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename != __file__ and code not in TRAMPOLINE_CODES:
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _start(**fields: Any) -> None:
    """The probe in this process: its state, its hooks on torch_xla's import, its 'start' record."""
    global PROBE, LIBRARY_DIRS
    PROBE = _Probe()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _dump_stacks_on_sigusr1()
    _when_imported("torch_xla", _instrument_torch_xla)
    _when_imported("multiprocessing.spawn", _instrument_spawn)
    libraries = _libraries()
    LIBRARY_DIRS = tuple(
        os.path.join(os.path.realpath(p), "") for paths in libraries.values() for p in paths if p
    )
    _when_imported("subprocess", _instrument_subprocess)  # after LIBRARY_DIRS: it asks _is_user
    PROBE.write("start", cwd=os.getcwd(), python=sys.executable, libraries=libraries, **fields)


# -- processes the script starts itself (subprocess): not followed, noted --------------------------


def _instrument_subprocess(module: Any) -> None:
    """A process the script's own code starts (``subprocess.run``, ``Popen``) is noted with its command
    and line: the doctor does not follow it, and the report says so."""
    _patch(module.Popen, "__init__", _noting_process)


def _noting_process(real: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, args: Any, *more: Any, **kwargs: Any) -> None:
        frame: Any = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == real.__code__.co_filename:
            frame = frame.f_back  # subprocess.run, check_call, ...: subprocess's own frames
        if PROBE is not None and frame is not None and _is_user(frame.f_code.co_filename):
            command = args if isinstance(args, (str, bytes)) else " ".join(map(str, args))
            PROBE.write("process", command=str(command)[:300], stack=stack(2))
        real(self, args, *more, **kwargs)

    __init__.__wrapped__ = real  # type: ignore[attr-defined]
    return __init__


# -- fresh interpreters the script starts (torch_xla.launch, xmp.spawn: multiprocessing's spawn) -------


def _instrument_spawn(module: Any) -> None:
    """Each interpreter multiprocessing spawns loads this probe first (``spawned_main``)."""
    _patch(module, "get_command_line", _probed_command_line)


def _probed_command_line(real: Callable[..., Any]) -> Callable[..., Any]:
    def get_command_line(**kwds: Any) -> list[str]:
        command = list(real(**kwds))
        if "-c" in command:
            at = command.index("-c") + 1
            command[at] = SPAWNED_BOOT.replace("PROBE_FILE", repr(__file__)) + command[at]
        return command

    get_command_line.__wrapped__ = real  # type: ignore[attr-defined]
    return get_command_line


def spawned_main() -> None:
    """In an interpreter multiprocessing spawned for the script: the probe, until that process ends."""
    import atexit

    if DIR_ENV not in os.environ or not os.path.isdir(os.environ[DIR_ENV]):
        return
    _start(spawned=True, argv=sys.argv)
    atexit.register(_restore)


SPAWNED_BOOT = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('xlapipe_doctor_probe', PROBE_FILE); "
    "probe = importlib.util.module_from_spec(spec); sys.modules[spec.name] = probe; "
    "spec.loader.exec_module(probe); probe.spawned_main(); "
)


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` with arguments ``argv[1:]`` as ``python`` would; return its exit status."""
    script = argv[0]
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    _start(argv=sys.argv)
    assert PROBE is not None
    status, error = 0, None
    try:
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException as failure:  # the script's own error: shown as python would, and noted
        tb = failure.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != os.path.abspath(script):
            tb = tb.tb_next  # the probe's and runpy's frames are not the script's
        traceback.print_exception(type(failure), failure, _without_probe(tb) or failure.__traceback__)
        status, error = (
            1,
            {
                "type": type(failure).__name__,
                "message": str(failure)[:2000],
                "stack": [
                    [f.filename, f.lineno, f.name] for f in traceback.extract_tb(failure.__traceback__)
                ],
            },
        )
    finally:
        _restore()
        faulthandler.unregister(signal.SIGUSR1)
        for f in STACK_FILES:
            f.close()
    PROBE.write("end", status=status, error=error)
    return status


# How the doctor starts this file: as a module of its own name (not ``__main__``, which the script
# becomes), importing nothing of xlapipe. ``python -c BOOT PROBE_FILE SCRIPT ARGS...``
BOOT = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('xlapipe_doctor_probe', sys.argv[1]); "
    "probe = importlib.util.module_from_spec(spec); sys.modules[spec.name] = probe; "
    "spec.loader.exec_module(probe); sys.exit(probe.main(sys.argv[2:]))"
)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: probe.py SCRIPT [ARGS...] (run by xlapipe doctor)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
