"""compile_step: run forward, backward and the optimizer update as compiled graphs.

torch_xla's lazy tensors re-record every operation of every step in Python
before the step marker hands the graph to XLA; on a small model that tracing,
not the device, sets the pace. ``torch.compile(backend="openxla")`` captures
the step once with dynamo; later steps only check dynamo's guards and run the
cached XLA executables.

What runs compiled (through the step's hooks, :mod:`xlapipe.hooks`):

- forward and loss, *with the precision policy's autocast inside the compiled
  region* (so bf16/fp16 autocast is part of the captured graph);
- backward: AOTAutograd compiles it from the forward graph;
- with ``optimizer=True`` (the default), ``optimizer.step`` too; gradients are
  reduced across replicas first (``xm.reduce_gradients``), as
  ``xm.optimizer_step`` does. With fp16 the gradient scaler's step is left
  uncompiled (it reads ``found_inf`` on the host every step).

The compiled graphs execute when called; whatever is still traced lazily is
flushed by the usual single step marker (the step's own, or
``wrap_loader_mp``'s before the next batch), so both compose unchanged.

Two torch_xla 2.9 defects are handled here rather than left to bite:

- its XLA kernel for ``aten::native_dropout`` scales the kept values by
  ``1/p`` instead of ``1/(1-p)`` (dropout 0.1 multiplies by 10). Lazy
  ``F.dropout`` does not use that kernel; compiled graphs do (AOTAutograd
  lowers dropout to it). While a session with compile_step lasts, a correct
  kernel is registered for the XLA device (:class:`CorrectNativeDropout`,
  only when a probe finds the installed one wrong), and removed on exit.
- its dynamo bridge can hand back the graph's outputs in the wrong order
  (seen: an identity dropout after ``tanh`` — BERT's pooler in eval mode or
  with dropout 0 — makes the "loss" come back as the [batch, 2] logits). The
  first run of every compiled graph checks its outputs' shapes and dtypes
  against what dynamo traced and raises :class:`CompileStepError` on a
  mismatch (a mix-up between outputs of one shape would pass unseen).

The openxla backend excludes ``shard_data``: under SPMD (torch_xla 2.9, 4
CPU devices) the compiled step's losses part from the lazily traced loop's
from the third step on, with the optimizer update compiled or not. It also
excludes ``scan_layers``, whose scan dynamo cannot lower; the torch_xla
backend runs a scanned step (the errors say so: ``OPENXLA_EXCLUDES``).

Caveats: compiled graphs are specialised to shapes (``dynamic=False``): a new
batch shape compiles anew, exactly as lazy tracing does, so pair this with
fixed shapes. Pass the same ``loss_fn`` every step. Random ops (dropout) draw
from another stream than lazy tracing, so with dropout the losses are equal
in distribution, not value by value. A float learning rate that changes (a
scheduler) is baked into the compiled optimizer update and recompiles it:
with a schedule, use ``optimizer=False``.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from attrs import frozen

from xlapipe.hooks import Action, Forward, Hook, Step
from xlapipe.transform import Transform, check_flag, register, unchanged
from xlapipe.transforms.host_reads import host_read_error

if TYPE_CHECKING:
    from xlapipe.run import Run

BACKENDS = ("openxla", "torch_xla")

# Why dynamo (backend="openxla") cannot be combined with these, measured with torch_xla 2.9.
OPENXLA_EXCLUDES = {
    "shard_data": "with backend='openxla' the compiled step's losses part from the lazily traced ones "
    "from the third step on under SPMD (4 CPU devices); remove one of them",
    "scan_layers": "with backend='openxla' dynamo traces the step with fake tensors, which torch_xla's "
    "scan cannot lower ('Expected XLA tensor. Got: XLAFloatType'). Use compile_step(backend='torch_xla'), "
    "which runs the scanned step as one lazy region, or remove one of them.",
}


class CompileStepWarning(UserWarning):
    """compile_step is used in a way that makes it recompile or fall back to eager."""


class CompileStepError(RuntimeError):
    """The compiled step does not compute what the loss function computes."""


# -- torch_xla 2.9's native_dropout kernel ------------------------------------------------

_probe: bool | None = None


def native_dropout_is_correct() -> bool:
    """Whether the XLA kernel of ``aten::native_dropout`` scales by ``1/(1-p)`` (runs once)."""
    global _probe
    if _probe is None:
        import torch_xla

        out, keep = torch.ops.aten.native_dropout(torch.ones(256, device=torch_xla.device()), 0.25, True)
        kept = out.cpu()[keep.cpu()]
        _probe = bool(kept.numel() == 0 or torch.allclose(kept, torch.full_like(kept, 1 / 0.75)))
    return _probe


def _native_dropout(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    if train is False or p == 0.0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = torch.rand_like(input) >= p
    return input * keep * (1.0 / (1.0 - p)), keep


@frozen
class CorrectNativeDropout:
    """The effect: a correct XLA kernel for ``aten::native_dropout`` while the session lasts."""

    before_runtime: bool = False

    def apply(self) -> Callable[[], None]:
        if native_dropout_is_correct():
            return lambda: None
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(overrid|Overrid).*", category=UserWarning)
            library.impl("native_dropout", _native_dropout, "XLA")
        return library._destroy

    def describe(self) -> dict:
        return {"effect": "correct_native_dropout", "device": "xla"}


# -- the transform ------------------------------------------------------------------------


@frozen
class CompileStep(Hook):
    """The hook: forward+loss, and with ``optimizer`` the update, compiled for each run."""

    backend: str
    optimizer: bool

    def start(self, run: Run) -> Hook:
        return _CompiledRun(self, run)

    def describe(self) -> dict:
        return {"hook": "compile_step", "backend": self.backend, "optimizer": self.optimizer}


class _CompiledRun(Hook):
    """One run's compiled functions (dynamo's caches are per function object: per run)."""

    def __init__(self, spec: CompileStep, run: Run) -> None:
        self.spec, self.run = spec, run
        self.forwards = 0
        self.lrs: tuple | None = None
        self.warned_lr = False

    def wrap_forward(self, forward: Forward) -> Forward:
        self.forwards += 1
        if self.forwards > 1:
            warnings.warn(
                "compile_step: train_step got a different loss_fn than in the previous step, so "
                "the step is captured and compiled again. Pass the same loss function object "
                "every step (not a new lambda each time).",
                CompileStepWarning,
                stacklevel=7,
            )
        return _compile(forward, self.spec.backend)

    def wrap_optimizer_step(self, step: Action) -> Action:
        if not self.spec.optimizer or self.run.scaler is not None:
            return step  # fp16's scaler reads found_inf on the host every step: left uncompiled
        optimizer = self.run.optimizer
        assert optimizer is not None

        def optimizer_step() -> None:
            optimizer.step()

        compiled = _compile(optimizer_step, self.spec.backend)

        def checked() -> None:
            self._check_learning_rate()
            with warnings.catch_warnings():
                # Optimizers keep their step count on the CPU; the bridge notes it when capturing.
                warnings.filterwarnings("ignore", message="Found tensor with shape", category=UserWarning)
                compiled()

        return checked

    def _check_learning_rate(self) -> None:
        assert self.run.optimizer is not None
        lrs = tuple(g.get("lr") for g in self.run.optimizer.param_groups)
        before, self.lrs = self.lrs, lrs
        if before is not None and before != lrs and any(isinstance(v, float) for v in lrs):
            if not self.warned_lr:
                self.warned_lr = True
                warnings.warn(
                    "compile_step: the learning rate changed from "
                    f"{before} to {lrs}; a float learning rate is a constant of the compiled "
                    "optimizer update, so every new value recompiles it. With a learning-rate "
                    "schedule use compile_step(optimizer=False).",
                    CompileStepWarning,
                    stacklevel=7,
                )


@frozen
class LazyCompiledStep(Hook):
    """The hook of the ``torch_xla`` backend: the whole step as one ``torch_xla.compile`` region."""

    full_graph: bool
    max_different_graphs: int | None

    marks_step = True  # torch_xla.compile ends its region with a step marker

    def start(self, run: Run) -> Hook:
        if self.full_graph and run.scaler is not None:
            raise CompileStepError(
                "compile_step(backend='torch_xla', full_graph=True) allows no execution inside the "
                "step, and fp16's gradient scaler reads found_inf on the host in every step. Use "
                "bf16, or full_graph=False."
            )
        return self

    def wrap_step(self, step: Step) -> Step:
        import torch_xla

        compiled = torch_xla.compile(
            step,
            full_graph=self.full_graph,
            name="xlapipe_step",
            max_different_graphs=self.max_different_graphs,
        )

        def step_in_region(batch: Any) -> tuple[torch.Tensor, bool]:
            try:
                result: tuple[torch.Tensor, bool] = compiled(batch)
                return result
            except RuntimeError as error:
                if "Maximum number of different graphs" in str(error):
                    raise CompileStepError(
                        f"compile_step(backend='torch_xla', max_different_graphs="
                        f"{self.max_different_graphs}): this step traced a graph unlike the ones "
                        f"before it. torch_xla: {error}. Make the shapes static (static_shapes, "
                        "drop_last) or raise max_different_graphs."
                    ) from error
                raise host_read_error(error) from error

        return step_in_region

    def describe(self) -> dict:
        return {
            "hook": "compile_step",
            "backend": "torch_xla",
            "full_graph": self.full_graph,
            "max_different_graphs": self.max_different_graphs,
        }


@register
def compile_step(
    backend: str = "openxla",
    optimizer: bool = True,
    full_graph: bool = False,
    max_different_graphs: int | None = None,
) -> Transform:
    """Compile the training step.

    ``backend="openxla"``: forward+backward (and, with ``optimizer``, the
    update) captured once by ``torch.compile``; later steps skip Python
    tracing. ``backend="torch_xla"``: the whole step traced lazily as one
    ``torch_xla.compile`` region, ``full_graph`` refusing any execution inside
    it (a host read) and ``max_different_graphs`` refusing a step that traces
    a graph beyond that many.
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"compile_step: backend {backend!r} is not supported; choose one of "
            f"{', '.join(map(repr, BACKENDS))} (torch.compile's XLA training backend, or "
            "torch_xla.compile's lazy region)"
        )
    check_flag("compile_step", "optimizer", optimizer)
    check_flag("compile_step", "full_graph", full_graph)
    if max_different_graphs is not None and (
        not isinstance(max_different_graphs, int)
        or isinstance(max_different_graphs, bool)
        or max_different_graphs < 1
    ):
        raise ValueError(
            f"compile_step: max_different_graphs must be a positive int or None, got {max_different_graphs!r}"
        )
    if backend == "openxla" and (full_graph or max_different_graphs is not None):
        raise ValueError(
            "compile_step: full_graph and max_different_graphs are options of "
            "backend='torch_xla' (torch.compile's openxla backend has neither)"
        )
    if backend == "torch_xla" and not optimizer:
        raise ValueError(
            "compile_step(backend='torch_xla') traces the whole step, update included, "
            "as one region; optimizer=False is an option of backend='openxla'"
        )
    hook: Hook = (
        CompileStep(backend, optimizer)
        if backend == "openxla"
        else LazyCompiledStep(full_graph, max_different_graphs)
    )
    return Transform(
        "compile_step",
        unchanged,
        {
            "backend": backend,
            "optimizer": optimizer,
            "full_graph": full_graph,
            "max_different_graphs": max_different_graphs,
        },
        needs=("with_device",),
        excludes=OPENXLA_EXCLUDES if backend == "openxla" else (),
        effects=(CorrectNativeDropout(),) if backend == "openxla" else (),
        hooks=(hook,),
        reasons=OPENXLA_EXCLUDES if backend == "openxla" else (),
    )


def _compile(fn: Callable, backend: str) -> Callable:
    """``torch.compile(fn)`` with a code object of its own, its graphs' outputs checked.

    Dynamo keeps its cache, and its limit of 8 recompilations before silently
    running uncompiled, per code object: every run compiling the same function
    would share one and the ninth run in a process would not be compiled.
    """
    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    return torch.compile(own, backend=_checked(backend), dynamic=False)


def _checked(name: str) -> Callable:
    """The dynamo backend ``name``, each graph's first outputs checked against dynamo's record."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(name)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        expected = _expected_outputs(gm)
        compiled = inner(gm, example_inputs)
        checked: list[bool] = []

        def run(*args: Any) -> Any:
            out = compiled(*args)
            if not checked:
                _compare(out, expected)
                checked.append(True)
            return out

        return run

    return backend


def _expected_outputs(gm: torch.fx.GraphModule) -> list:
    from torch.utils._pytree import tree_leaves

    node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves = tree_leaves(node.args[0], is_leaf=lambda x: isinstance(x, torch.fx.Node))
    return [n.meta.get("example_value") if isinstance(n, torch.fx.Node) else n for n in leaves]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _compare(out: Any, expected: list) -> None:
    from torch.utils._pytree import tree_leaves

    got = tree_leaves(out)
    for i, (g, e) in enumerate(zip(got, expected)):
        if not isinstance(e, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
            raise CompileStepError(
                f"compile_step: output {i} of a compiled graph is {_describe(g)} where the "
                f"traced graph produces {_describe(e)}. torch_xla's dynamo bridge (torch.compile "
                "backend 'openxla') has handed back this graph's outputs in the wrong order "
                "(seen in torch_xla 2.9 when an identity op, such as dropout in eval mode or with "
                "p=0, follows tanh, as in BERT's pooler). Training with it would be wrong: "
                "remove compile_step from the pipeline for this model."
            )
