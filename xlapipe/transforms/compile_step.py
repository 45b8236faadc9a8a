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
- with ``optimizer=True`` (not the default), the update too: the window's
  gradients reduced across replicas (``xm.reduce_gradients``, as
  ``xm.optimizer_step`` does), averaged, the ``on_gradients`` practices
  (clipping) and ``optimizer.step``, as one compiled graph. With fp16 the
  update is left uncompiled (the gradient scaler reads ``found_inf`` on the
  host every step). torch_xla 2.9's dynamo bridge keeps the compiled update's
  optimizer state apart from what the optimizer shows (measured: AdamW's step
  count of a parameter group at 0 after 20 updates), so a checkpoint under it
  is refused, and a rate of 0 (which the tensor rate below divides by) is
  refused too: a scheduler (its rate may reach 0) or a group at rate 0 when
  the session starts, a rate of 0 set by hand at the update. The default,
  ``optimizer=False``, runs the update lazily and has none of these limits.

The compiled graphs execute when called; whatever is still traced lazily is
flushed by the usual single step marker (the step's own, or
``wrap_loader_mp``'s before the next batch), so both compose unchanged.

Three torch_xla 2.9 defects are handled here rather than left to bite:

- it gives some composite ops a kernel of its own with no gradient (``std``
  over a dimension, ``kl_div``, ``diag``, ``inverse``, ``selu``, ...): traced
  lazily they are differentiated anyway, but in a graph dynamo compiles no
  parameter before one gets a gradient. While a session with compile_step
  lasts, their autograd kernel on XLA is PyTorch's decomposition
  (:class:`xlapipe.kernel_fixes.DecomposeForAutograd`).

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
backend runs a scanned step (the errors say so: ``OPENXLA_EXCLUDES``). It
refuses a model with a recurrent layer (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``)
when the session starts: the bridge died on a 2-layer LSTM inside torch. The
torch_xla backend trains it as eager does.

Caveats: compiled graphs are specialised to shapes (``dynamic=False``): a new
batch shape compiles anew, exactly as lazy tracing does, so pair this with
fixed shapes. Pass the same ``loss_fn`` every step. Random ops (dropout) draw
from another stream than lazy tracing, so with dropout the losses are equal
in distribution, not value by value.

Hyperparameters: the learning rate of ``torch.optim.SGD``, ``Adam`` and
``AdamW`` is handed to the compiled update as data (a device tensor refilled
before each update), so a rate set by hand
(``group["lr"] = ...``) takes effect without recompiling. Any other value in
the parameter groups (betas, weight decay, momentum; the rate of other
optimizers) is a constant of the compiled update: torch_xla 2.9's dynamo
bridge recompiles on a new value and, measured, then trained numbers 3e-2 off
eager's; nor can an optimizer switch between compiled and uncompiled updates
(measured: Adam's step count, kept by the compiled update, was lost to the
uncompiled one). So an update whose constants changed is refused with a
:class:`CompileStepError` before it changes anything: schedule such values
with ``compile_step(optimizer=False)``.
"""

from __future__ import annotations

import contextlib
import copy
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from attrs import field, frozen

from xlapipe import checks, claims, kernel_fixes
from xlapipe.claims import Claim
from xlapipe.effects import KeepEnv
from xlapipe.hooks import Action, Context, Forward, Hook, Step
from xlapipe.transform import Transform, practice, register
from xlapipe.transforms.host_reads import host_read_error

BACKENDS = ("openxla", "torch_xla")

# Why dynamo (backend="openxla") cannot be combined with these, measured with torch_xla 2.9.
OPENXLA_EXCLUDES = {
    "shard_data": "with backend='openxla' the compiled step's losses part from the lazily traced ones "
    "from the third step on under SPMD (4 CPU devices); remove one of them",
    "scan_layers": "with backend='openxla' dynamo traces the step with fake tensors, which torch_xla's "
    "scan cannot lower ('Expected XLA tensor. Got: XLAFloatType'). Use compile_step(backend='torch_xla'), "
    "which runs the scanned step as one lazy region, or remove one of them.",
}

# A checkpoint under compile_step(optimizer=True) is refused (see CompileStep.before_save).
PREEMPTION_EXCLUDED = {
    "checkpoint_on_preemption": "with optimizer=True checkpoints are refused (torch_xla 2.9's dynamo bridge "
    "keeps the compiled update's optimizer state apart from the optimizer's), so a preemption would "
    "save nothing. Use compile_step(optimizer=False), whose checkpoints resume exactly"
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
        return kernel_fixes.installed("native_dropout", _native_dropout)

    def describe(self) -> dict:
        return {"effect": "correct_native_dropout", "device": "xla"}


# -- the transform ------------------------------------------------------------------------


# Optimizers whose update takes a tensor learning rate (checked in tests/test_compile_step.py).
LR_AS_DATA = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
_NOT_HYPERPARAMETERS = ("params", "param_names", "initial_lr")


@frozen
class CompileStep(Hook):
    """The practice's parameters; each run gets the compiled functions of its backend."""

    backend: str = field(default="openxla", validator=checks.one_of("compile_step", "backend", BACKENDS))
    optimizer: bool = field(default=False, validator=checks.flag("compile_step", "optimizer"))
    full_graph: bool = field(default=False, validator=checks.flag("compile_step", "full_graph"))
    max_different_graphs: int | None = field(
        default=None, validator=checks.positive_int("compile_step", "max_different_graphs", optional=True)
    )

    def __attrs_post_init__(self) -> None:
        if self.backend == "openxla" and (self.full_graph or self.max_different_graphs is not None):
            raise ValueError(
                "compile_step: full_graph and max_different_graphs are options of "
                "backend='torch_xla' (torch.compile's openxla backend has neither)"
            )
        if self.backend == "torch_xla" and self.optimizer:
            raise ValueError(
                "compile_step(backend='torch_xla') traces the whole step, the update included, "
                "as one region; optimizer=True is an option of backend='openxla'"
            )

    @property
    def marks_step(self) -> bool:  # type: ignore[override]  # torch_xla's region ends with a step marker
        return self.backend == "torch_xla"

    def start(self, run: Context) -> Hook:
        if self.backend == "torch_xla":
            return _LazyRegion(self, run)
        return _CompiledRun(self, run)


class _CompiledRun(Hook):
    """One run's compiled functions (dynamo's caches are per function object: per run)."""

    def __init__(self, spec: CompileStep, run: Context) -> None:
        refuse_recurrent_layers(run.model)
        if spec.optimizer and run.scaler is None:
            refuse_unsafe_rates(run)
        self.spec, self.run = spec, run
        self.caches = dynamo_caches()
        self.forwards = 0
        self.constants: list[dict[str, Any]] | None = None  # the update's constants it was compiled with
        self.random = False  # a compiled forward draws random numbers (dropout)
        self.lrs: list[torch.Tensor] = []

    def wrap_forward(self, forward: Forward) -> Forward:
        self.forwards += 1
        if self.forwards > 1:
            warnings.warn(
                "compile_step: run.step got a different loss_fn than in the previous step, so "
                "the step is captured and compiled again. Pass the same loss function object "
                "every step (not a new lambda each time).",
                CompileStepWarning,
                stacklevel=7,
            )
        return _compile(forward, self.spec.backend, on_graph=self._note_graph)

    def _note_graph(self, gm: torch.fx.GraphModule) -> None:
        self.random = self.random or draws_random_numbers(gm)

    def before_save(self) -> None:
        if self.spec.optimizer and self.run.scaler is None:
            raise ValueError(
                "checkpoint.save under compile_step(optimizer=True): torch_xla 2.9's dynamo bridge keeps "
                "the compiled update's optimizer state apart from the state the optimizer holds (measured: "
                "AdamW's step count of the first parameter group still 0 after 20 compiled updates), so "
                "a checkpoint would resume with the wrong state. Use compile_step(optimizer=False), whose "
                "forward and backward stay compiled and whose checkpoints resume exactly"
            )
        if self.random:
            raise ValueError(
                "checkpoint.save under compile_step(backend='openxla') with random ops (dropout) in the "
                "compiled forward: torch_xla 2.9's dynamo bridge steps the XLA generator on by itself "
                "while it captures a graph (seen: the first step of every session draws as if seeded "
                "twice over), so a run resumed from this checkpoint would draw other dropout masks than "
                "the uninterrupted one. Use compile_step(backend='torch_xla'), whose resumes are exact, "
                "or compile_step without dropout (p=0, or model.eval() for the layers that have it)"
            )

    def wrap_apply(self, apply: Action) -> Action:
        if not self.spec.optimizer or self.run.scaler is not None:
            return apply  # fp16's scaler reads found_inf on the host every step: left uncompiled
        compiled = _compile(apply, self.spec.backend)
        optimizer = self.run.optimizer
        assert optimizer is not None
        lr_as_data = isinstance(optimizer, LR_AS_DATA)

        def update() -> None:
            self._check_constants(optimizer, lr_as_data)
            with warnings.catch_warnings():
                # Optimizers keep their step count on the CPU; the bridge notes it when capturing.
                warnings.filterwarnings("ignore", message="Found tensor with shape", category=UserWarning)
                if lr_as_data:
                    with self._lr_as_data(optimizer):
                        compiled()
                else:
                    compiled()

        return update

    def _check_constants(self, optimizer: torch.optim.Optimizer, lr_as_data: bool) -> None:
        """Refuse an update whose constants differ from those the update was compiled with."""
        skip = (*_NOT_HYPERPARAMETERS, "lr") if lr_as_data else _NOT_HYPERPARAMETERS
        now = [{k: v for k, v in g.items() if k not in skip} for g in optimizer.param_groups]
        if lr_as_data and any(_is_zero(g["lr"]) for g in optimizer.param_groups):
            raise CompileStepError(
                "compile_step(optimizer=True): a learning rate of 0, set by hand during training. The "
                "compiled update gets the rate as a tensor, and torch's optimizers divide by a tensor rate "
                "(measured: NaN in the rows of an embedding without a gradient), so this update was not "
                "applied. Use compile_step(optimizer=False), or never set a rate of 0."
            )
        if self.constants is None:
            self.constants = copy.deepcopy(now)
            return
        if now == self.constants:
            return
        changed = sorted(
            f"{k} of group {i} ({old[k]!r} -> {new.get(k)!r})"
            for i, (old, new) in enumerate(zip(self.constants, now))
            for k in old
            if new.get(k) != old[k]
        )
        raise CompileStepError(
            f"compile_step: {', '.join(changed) or 'the parameter groups'} changed since the optimizer "
            "update was compiled, which holds these values as constants (the learning rate is data only "
            f"for SGD, Adam and AdamW; this is {type(optimizer).__name__}). torch_xla's dynamo bridge "
            "trains wrong numbers with a changed constant, and an optimizer cannot switch to uncompiled "
            "updates midway (its step count is lost), so this update was not applied. To change these "
            "values during training, use compile_step(optimizer=False): forward and backward stay compiled."
        )

    def close(self) -> None:
        forget_new_caches(self.caches)

    @contextlib.contextmanager
    def _lr_as_data(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Each group's float learning rate swapped for a device tensor holding it, while compiled()."""
        groups = optimizer.param_groups
        while len(self.lrs) < len(groups):
            self.lrs.append(torch.zeros((), device=self.run.device))
        saved = [g["lr"] for g in groups]
        for tensor, group in zip(self.lrs, groups):
            if not isinstance(group["lr"], torch.Tensor):
                tensor.fill_(float(group["lr"]))
                group["lr"] = tensor
        try:
            yield
        finally:
            for value, group in zip(saved, groups):
                group["lr"] = value


def refuse_recurrent_layers(model: torch.nn.Module) -> None:
    """Refuse a model with an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` under the openxla backend."""
    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)})
    if found:
        raise CompileStepError(
            f"compile_step(backend='openxla') with a recurrent layer ({', '.join(found)}) in the model: "
            "torch_xla 2.9's dynamo bridge dies on it inside torch (measured on a 2-layer LSTM language "
            "model, its hidden state carried across steps or not: an IndexError in the bridge's "
            "output permutation, or 'Failed to get computation by hash'). Use "
            "compile_step(backend='torch_xla'), which trains it as eager does, or no compile_step."
        )


def refuse_unsafe_rates(run: Context) -> None:
    """Refuse, before training, a compiled update that a learning rate of 0 or a schedule would break."""
    optimizer = run.optimizer
    if optimizer is None:
        return
    if run.scheduler is not None:
        raise CompileStepError(
            f"compile_step(optimizer=True) with a learning-rate scheduler ({type(run.scheduler).__name__}): "
            "a schedule can reach a rate of 0 (a warm-up's first update, a decay's last), where the "
            "compiled update of SGD, Adam and AdamW divides by its tensor rate (measured: NaN weights "
            "at the last update), and for other optimizers the rate is a constant of the compiled "
            "update, which a schedule changes. Use compile_step(optimizer=False): forward and backward "
            "stay compiled and the update runs every schedule as eager does."
        )
    if isinstance(optimizer, LR_AS_DATA):
        zero = [i for i, g in enumerate(optimizer.param_groups) if _is_zero(g["lr"])]
        if zero:
            raise CompileStepError(
                f"compile_step(optimizer=True) with a learning rate of 0 in parameter group(s) {zero} "
                "(a frozen group): the compiled update gets the rate as a tensor, and torch's optimizers "
                "divide by it (measured: NaN). Use compile_step(optimizer=False), or freeze those "
                "parameters with requires_grad=False and leave them out of the optimizer."
            )


def _is_zero(lr: object) -> bool:
    return bool(lr == 0) if not isinstance(lr, torch.Tensor) else bool((lr == 0).any())


class _LazyRegion(Hook):
    """The torch_xla backend: the whole step traced as one ``torch_xla.compile`` region."""

    marks_step = True  # the region ends with a step marker

    def __init__(self, spec: CompileStep, run: Context) -> None:
        if spec.full_graph and run.scaler is not None:
            raise CompileStepError(
                "compile_step(backend='torch_xla', full_graph=True) allows no execution inside the "
                "step, and fp16's gradient scaler reads found_inf on the host in every step. Use "
                "bf16, or full_graph=False."
            )
        self.spec = spec

    def wrap_step(self, step: Step) -> Step:
        import torch_xla

        compiled = torch_xla.compile(
            step,
            full_graph=self.spec.full_graph,
            name="xlapipe_step",
            max_different_graphs=self.spec.max_different_graphs,
        )

        def step_in_region(batch: Any) -> tuple[torch.Tensor, bool]:
            try:
                result: tuple[torch.Tensor, bool] = compiled(batch)
                return result
            except RuntimeError as error:
                if "Maximum number of different graphs" in str(error):
                    raise CompileStepError(
                        f"compile_step(backend='torch_xla', max_different_graphs="
                        f"{self.spec.max_different_graphs}): this step traced a graph unlike the ones "
                        f"before it. torch_xla: {error}. Make the shapes static (static_shapes, "
                        "drop_last) or raise max_different_graphs."
                    ) from error
                raise host_read_error(error) from error

        return step_in_region


@register
def compile_step(
    backend: str = "openxla",
    optimizer: bool = False,
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
    spec = CompileStep(backend, optimizer, full_graph, max_different_graphs)
    openxla = backend == "openxla"
    excludes = {**(OPENXLA_EXCLUDES if openxla else {}), **(PREEMPTION_EXCLUDED if optimizer else {})}
    return practice(
        "compile_step",
        spec,
        needs=("with_device",),
        excludes=excludes,
        reasons=excludes,
        effects=(
            CorrectNativeDropout(),
            kernel_fixes.DecomposeForAutograd(),
            KeepEnv("TORCHINDUCTOR_CACHE_DIR"),
        )
        if openxla
        else (),
    )


def dynamo_caches() -> dict[Any, int]:
    """How many compiled entries dynamo holds for each code object it has seen."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo import convert_frame

    codes = (ref() for ref in convert_frame.input_codes.seen + convert_frame.output_codes.seen)
    return {code: len(_debug_get_cache_entry_list(code)) for code in codes if code is not None}


def forget_new_caches(before: dict[Any, int]) -> None:
    """Drop dynamo's entries for the code objects that gained some since ``before``.

    The step's own functions are copies that die with the run, but torch's
    optimizer breaks its graph on purpose (``torch._dynamo.graph_break()`` in
    ``Optimizer._use_grad``), so dynamo also keeps entries on torch's shared code
    (``Optimizer.step``'s wrapper, ``Adam.step``). Left there, they pile up
    across sessions to dynamo's recompile limit (from the ninth session the
    update ran uncompiled) and a later session can meet an entry compiled for an
    earlier one (seen: torch_xla's bridge then failing on a deleted buffer).
    """
    import torch._dynamo

    with torch._dynamo.convert_frame.compile_lock:
        for code, entries in dynamo_caches().items():
            if entries > before.get(code, 0):
                torch._dynamo.reset_code(code)


_RANDOM = ("dropout", "rand", "bernoulli", "normal", "uniform", "multinomial", "exponential", "poisson")


def draws_random_numbers(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph dynamo captured calls a random op (dropout, ``torch.rand``, ``bernoulli_``...)."""
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):
            name = getattr(node.target, "__name__", str(node.target)).lower()
            if "dropout" in name:
                p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
                training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
                if p == 0 or training is False:
                    continue  # draws nothing
            if any(word in name for word in _RANDOM):
                return True
    return False


def _compile(
    fn: Callable, backend: str, on_graph: Callable[[torch.fx.GraphModule], None] | None = None
) -> Callable:
    """``torch.compile(fn)`` with a code object of its own, its graphs' outputs checked.

    Dynamo keeps its cache, and its limit of 8 recompilations before silently
    running uncompiled, per code object: every run compiling the same function
    would share one and the ninth run in a process would not be compiled.
    """
    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    return torch.compile(own, backend=_checked(backend, on_graph), dynamic=False)


def _checked(name: str, on_graph: Callable[[torch.fx.GraphModule], None] | None = None) -> Callable:
    """The dynamo backend ``name``, each graph's first outputs checked against dynamo's record
    (and each graph shown to ``on_graph`` first)."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(name)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        if on_graph is not None:
            on_graph(gm)
        expected = _expected_outputs(gm)
        with _settings_kept(inner):
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


@contextlib.contextmanager
def _settings_kept(backend: Any) -> Iterator[None]:
    """Put back the settings of a process-wide ``aot_autograd`` backend (``openxla``) after it compiles.

    torch 2.9's ``AotAutograd.__call__`` stores its backward compiler back wrapped in two more
    ``disable`` calls each time it compiles a graph (pytorch/pytorch#93935, fixed after 2.9), so the
    wrapping deepens by one level per graph for the life of the process: after about 150 compiled
    graphs (sessions in a notebook, a sweep, a job that recompiles) every backward fails with
    ``RecursionError``. A graph already compiled keeps the compilers it was given.
    """
    kwargs = getattr(backend, "kwargs", None)
    if not isinstance(kwargs, dict):
        yield
        return
    saved = dict(kwargs)
    try:
        yield
    finally:
        kwargs.clear()
        kwargs.update(saved)


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


claims.declare(
    Claim(
        "compile_step",
        compile_step,
        summary="forward and backward compiled by torch.compile (openxla)",
        known=[
            claims.Known(
                "trains_as_eager",
                "dropout",
                "compiled dropout draws its masks from another stream than lazy tracing (the same "
                "distribution, other masks)",
            ),
            claims.Known(
                "interrupted",
                "dropout",
                "torch_xla's dynamo bridge steps the XLA generator while it captures a graph, so two "
                "sessions in one process draw other masks",
            ),
            *(
                claims.Known(
                    law,
                    "hf_model",
                    "refused at the first step, not when the session starts: torch_xla 2.9's dynamo "
                    "bridge hands BERT's pooler outputs back out of order (CompileStepError, before "
                    "anything changed); predicting it at the start would refuse models it works for",
                )
                for law in ("trains_as_eager", "resumes", "preempted", "interrupted")
            ),
        ],
        refuses=[
            claims.Refusal("lstm_state", r"recurrent layer \(LSTM\)", when="session"),
            claims.Refusal("dropout", "random ops", when="save", points=claims.SAVE_POINTS),
        ],
    )
)
