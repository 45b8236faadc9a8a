"""recompile_guard: notice when XLA compiles a new graph after warm-up, and say why.

Every new graph costs an XLA compilation (seconds for a real model); a loop
that keeps compiling after its first steps usually feeds changing shapes. The
guard reads torch_xla's ``UncachedCompile`` counter before and after every
training step (its hooks) and, when it rises after the warm-up (the steps of
the first ``warmup`` updates: with ``accumulate_grad(k)``, ``k * warmup``
micro-batches, so the update's own graph is seen in warm-up), warns
(``action="warn"``, a :class:`RecompileWarning`) or raises
(``action="raise"``, a :class:`RecompileError`) with the step number, the
shapes of that step's batch against the shapes seen in warm-up, the compile
time spent, and, with ``explain=True``, torch_xla's own compilation analysis
(cause, graph hash, the Python frame that triggered it).

``explain=True`` sets ``PT_XLA_DEBUG_LEVEL=1`` and ``PT_XLA_DEBUG_FILE``,
which torch_xla reads once when its runtime starts: the session must be the
first thing in the process to touch the device.

Attribution: with ``wrap_loader_mp`` the step marker that compiles step k's
graph runs when the loader hands out batch k+1, so the guard checks at the
start of each step (compiles since the end of the last one belong to it) and
at its end (compiles inside it: ``torch.compile`` capture, values read on the
host). Compilations by code run between steps, such as an evaluation loop,
are attributed to the previous step; run such code under ``run.evaluating()``
or :func:`unguarded` (``run.outside_step()``), which set it aside.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from attrs import define, field, frozen

from xlapipe import checks, claims, metrics
from xlapipe.claims import Claim
from xlapipe.effects import EnvVar
from xlapipe.hooks import Context, Hook, Step
from xlapipe.transform import Transform, practice, register

ACTIONS = ("warn", "raise")
_MAX_ANALYSES = 3
_MAX_GRAPHS = 16
_INPUTS = ("xla::device_data", "prim::Constant")
_IR_LINE = re.compile(r"^\s*%\d+ = (?P<shape>\S+) (?P<op>[\w:.]+)")


class RecompileWarning(RuntimeWarning):
    """XLA compiled a new graph after warm-up (``recompile_guard(action="warn")``)."""


class RecompileError(RuntimeError):
    """XLA compiled a new graph after warm-up (``recompile_guard(action="raise")``)."""

    def __init__(self, message: str, event: dict[str, Any]):
        super().__init__(message)
        self.event = event


def shapes(batch: Any, prefix: str = "batch") -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in ``batch`` (nested dicts, lists, tuples), by its path."""
    if isinstance(batch, torch.Tensor):
        return {prefix: tuple(batch.shape)}
    out: dict[str, tuple[int, ...]] = {}
    if isinstance(batch, Mapping):
        for k, v in batch.items():
            out.update(shapes(v, f"{prefix}[{k!r}]"))
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            out.update(shapes(v, f"{prefix}[{i}]"))
    return out


@frozen
class RecompileGuard(Hook):
    """The practice's parameters and its hook; each run gets a :class:`_GuardRun` with its counts."""

    warmup: int = field(validator=checks.non_negative_int("recompile_guard", "warmup", " (updates)"))
    action: str = field(default="warn", validator=checks.one_of("recompile_guard", "action", ACTIONS))
    # torch_xla writes its compilation analysis to PT_XLA_DEBUG_FILE
    explain: bool = field(default=False, validator=checks.flag("recompile_guard", "explain"))

    def start(self, run: Context) -> Hook:
        path = os.environ.get("PT_XLA_DEBUG_FILE") if self.explain else None
        offset = os.path.getsize(path) if path and os.path.exists(path) else 0
        return _GuardRun(self, _GuardState(_compiles(), _compile_s(), path, offset), run)


class _GuardRun(Hook):
    def __init__(self, guard: RecompileGuard, state: _GuardState, run: Context) -> None:
        self.guard, self.state, self.run = guard, state, run
        self.params = list(run.model.parameters())
        self.lazy = run.device.type == "xla"

    def wrap_step(self, step: Step) -> Step:
        """Note the graph each step leaves for its step marker (its hash; its IR when new)."""
        if not self.lazy:
            return step

        def noted(batch: Any) -> tuple[torch.Tensor, bool]:
            loss, updated = step(batch)
            self.state.note_graph([loss, *self.params], self.state.warm)
            return loss, updated

        return noted

    def before_step(self, batch: Any) -> Any:
        """Compiles since the last check belong to the previous step (its step marker)."""
        state = self.state
        if state.step > 0:
            self._check(state.step, state.last_shapes, "at the step marker after it")
        state.step += 1
        state.warm = self.run.updates < self.guard.warmup  # warm-up counts updates, not micro-batches
        return batch

    def after_step(self, batch: Any, loss: torch.Tensor, updated: bool) -> None:
        """Compiles during this step belong to it."""
        state = self.state
        state.last_shapes = shapes(batch)
        if state.warm:
            state.warmup_shapes.add(tuple(sorted(state.last_shapes.items())))
        self._check(state.step, state.last_shapes, "during it")

    @contextlib.contextmanager
    def outside_step(self) -> Iterator[None]:
        """Compilations inside (evaluation, checkpointing) are not held against training."""
        self._check(self.state.step, self.state.last_shapes, "at the step marker after it")
        try:
            yield
        finally:
            self._set_aside()

    def end_epoch(self) -> None:
        """The update of an epoch's partial window is not the step: its graph is set aside."""
        self._set_aside()

    def _set_aside(self) -> None:
        state = self.state
        state.compiles, state.compile_s = _compiles(), _compile_s()
        _read_analysis(state)

    def _check(self, step: int, batch_shapes: dict, when: str) -> None:
        state, guard = self.state, self.guard
        compiles = _compiles()
        if compiles == state.compiles:
            return
        compile_s = _compile_s()
        new, spent = compiles - state.compiles, compile_s - state.compile_s
        state.compiles, state.compile_s = compiles, compile_s
        analysis = _read_analysis(state)
        if state.warm:
            return
        event = {
            "step": step,
            "new_compiles": new,
            "compile_s": spent,
            "when": when,
            "shapes": {k: list(v) for k, v in batch_shapes.items()},
            "warmup_shapes": [{k: list(v) for k, v in s} for s in sorted(state.warmup_shapes)],
            "difference": state.difference(),
            "analysis": analysis,
        }
        state.events.append(event)
        message = _message(guard, event, batch_shapes, state.warmup_shapes, state.debug_file)
        if guard.action == "raise":
            raise RecompileError(message, event)
        warnings.warn(message, RecompileWarning, stacklevel=5)


@define
class _GuardState:
    compiles: float
    compile_s: float
    debug_file: str | None = None
    debug_offset: int = 0
    step: int = 0
    warm: bool = True  # the step is part of the warm-up
    last_shapes: dict = field(factory=dict)
    warmup_shapes: set = field(factory=set)
    events: list = field(factory=list)
    graphs: dict = field(factory=dict)  # graph hash -> its IR text (the first few graphs seen)
    warmup_graphs: list = field(factory=list)  # hashes of the graphs traced during warm-up
    last_graph: bytes | None = None

    def note_graph(self, tensors: list[torch.Tensor], warming_up: bool) -> None:
        import torch_xla

        xlac = torch_xla._XLAC
        digest = xlac._get_graph_hash(tensors)  # cheap (microseconds); the IR text is not
        self.last_graph = digest
        if digest not in self.graphs and len(self.graphs) < _MAX_GRAPHS:
            self.graphs[digest] = xlac._get_xla_tensors_text(tensors)
        if warming_up and digest not in self.warmup_graphs:
            self.warmup_graphs.append(digest)

    def difference(self) -> dict[str, str] | None:
        """The first op of the last graph that differs from the closest warm-up graph."""
        new = self.graphs.get(self.last_graph)
        known = [self.graphs[h] for h in self.warmup_graphs if h in self.graphs and h != self.last_graph]
        return first_difference(new, known) if new and known else None


def _compiles() -> float:
    return metrics.counter("UncachedCompile")


def _compile_s() -> float:
    return metrics.total_s("CompileTime")


def _read_analysis(state: _GuardState) -> list[str]:
    if not state.debug_file or not os.path.exists(state.debug_file):
        return []
    with open(state.debug_file, encoding="utf-8", errors="replace") as f:
        f.seek(state.debug_offset)
        text = f.read()
        state.debug_offset = f.tell()
    return _analyses(text)


def events(run: Context) -> list[dict[str, Any]]:
    """The recompilations the guard saw after warm-up in ``run`` (plain data)."""
    guard = run.hook(_GuardRun)
    return list(guard.state.events) if guard is not None else []


def unguarded(run: Any) -> contextlib.AbstractContextManager:
    """Compilations inside (evaluation, checkpointing) are not held against training.

    The same as ``run.outside_step()``: every practice sets the block aside,
    and what it traced on the device is executed when it ends.
    """
    context: contextlib.AbstractContextManager = run.outside_step()
    return context


def _ops(ir: str) -> list[tuple[str, str]]:
    """(op, shape) of each line of torch_xla's IR text, without the %N numbering."""
    return [(m["op"], m["shape"]) for line in ir.splitlines() if (m := _IR_LINE.match(line))]


def first_difference(new: str, known: list[str]) -> dict[str, str] | None:
    """Where IR ``new`` first departs from the closest of the graphs ``known``.

    The op and shape of the new graph there, the op and shape of the known
    graph, and the new graph's inputs (device data) whose shapes the known
    graph's inputs do not have.
    """
    ops = _ops(new)
    best = max(known, key=lambda old: difflib.SequenceMatcher(None, _ops(old), ops, autojunk=False).ratio())
    old_ops = _ops(best)
    blocks = [
        b
        for b in difflib.SequenceMatcher(None, old_ops, ops, autojunk=False).get_opcodes()
        if b[0] != "equal"
    ]
    if not blocks:
        return None
    # The first computation that differs; graph inputs and constants only if nothing else does.
    at = next(
        (
            (min(i1 + j - j1, max(i2 - 1, i1)), j)
            for _, i1, i2, j1, j2 in blocks
            for j in range(j1, j2)
            if ops[j][0] not in _INPUTS
        ),
        (blocks[0][1], blocks[0][3]),
    )
    got = ops[at[1]] if at[1] < len(ops) else ("(nothing)", "")
    was = old_ops[at[0]] if at[0] < len(old_ops) else ("(nothing)", "")
    inputs = sorted(
        {shape for op, shape in ops if op == "xla::device_data"}
        - {shape for op, shape in old_ops if op == "xla::device_data"}
    )
    return {
        "op": got[0],
        "shape": got[1],
        "expected_op": was[0],
        "expected_shape": was[1],
        "new_inputs": ", ".join(inputs),
    }


def _analyses(text: str) -> list[str]:
    """torch_xla's 'Compilation Analysis' blocks in ``text``, condensed."""
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if not line.startswith("Compilation Analysis:"):
            continue
        body = line[len("Compilation Analysis:") :].rstrip()
        if set(body.strip()) <= {"=", "-"}:
            if current:
                blocks.append("\n".join(current))
                current = []
            continue
        current.append(body)
    if current:
        blocks.append("\n".join(current))
    return blocks[-_MAX_ANALYSES:]


def _message(guard: RecompileGuard, event: dict, batch_shapes: dict, warmup: set, path: str | None) -> str:
    head = (
        f"recompile_guard: XLA compiled {event['new_compiles']:g} new graph(s) for step "
        f"{event['step']} ({event['when']}), after the {guard.warmup}-update warm-up; "
        f"{event['compile_s']:.2f} s of compiling."
    )
    known = [dict(s) for s in sorted(warmup)]
    if known and all(dict(batch_shapes) != s for s in known):
        changed = sorted(
            f"{k} {tuple(v)} (warm-up: {', '.join(sorted({str(s.get(k)) for s in known}))})"
            for k, v in batch_shapes.items()
            if all(s.get(k) != v for s in known)
        )
        why = (
            f"Its batch has shapes the warm-up never saw: {'; '.join(changed)}. Every new "
            "shape is a new graph: pad to fixed shapes (static_shapes) and drop the last "
            "partial batch (drop_last=True)."
        )
    elif known:
        why = (
            "Its batch shapes match the warm-up's, so the graph changed for another reason: "
            "a tensor read on the host (.item(), print), a Python number that changes "
            "(e.g. a learning rate under compile_step), a code path taken for the first "
            "time, or code run between steps (wrap evaluation in unguarded(run))."
        )
    else:
        why = "No batch was seen during warm-up (warmup=0): every shape counts as new."
    diff = event["difference"]
    if diff:
        why += (
            f" The first op that differs from the closest warm-up graph: {diff['op']} {diff['shape']} "
            f"where it had {diff['expected_op']} {diff['expected_shape']}"
            + (
                f"; inputs of shapes the warm-up graphs never had: {diff['new_inputs']}."
                if diff["new_inputs"]
                else "."
            )
        )
    if event["analysis"]:
        cause = "torch_xla's compilation analysis:\n" + "\n".join(
            re.sub(r"(?m)^", "    ", block) for block in event["analysis"]
        )
    elif guard.explain:
        cause = (
            f"torch_xla wrote no compilation analysis to {path!r}: PT_XLA_DEBUG_LEVEL is read "
            "when the runtime starts, so the session must start it (a fresh process)."
        )
    else:
        cause = (
            "For torch_xla's own account of the cause (compile cause, graph hash, the Python "
            "frame), use recompile_guard(explain=True) in a fresh process."
        )
    return f"{head} {why}\n{cause}"


def debug_file(explain: bool) -> str | None:
    """Where torch_xla writes its compilation analysis for this process (None: off)."""
    if not explain:
        return None
    return os.path.join(tempfile.gettempdir(), f"xlapipe-xla-debug-{os.getpid()}.txt")


@register
def recompile_guard(warmup: int = 3, action: str = "warn", explain: bool = False) -> Transform:
    """Warn (or raise) when XLA compiles a new graph after the first ``warmup`` updates' steps."""
    spec = RecompileGuard(warmup, action, explain)
    path = debug_file(explain)
    effects = (EnvVar("PT_XLA_DEBUG_LEVEL", "1"), EnvVar("PT_XLA_DEBUG_FILE", path)) if path else ()
    return practice(
        "recompile_guard",
        spec,
        needs=("with_device",),
        # It notes the graph each step leaves, inside a compiled region that would end it.
        after=("compile_step",),
        effects=effects,
    )


claims.declare(
    Claim(
        "recompile_guard",
        recompile_guard,
        summary="a compilation after warm-up warned about (or refused) with its cause",
    )
)
