"""scan_layers: trace and compile a stack of identical layers once, not once per layer.

XLA compiles what it is given: a 12-layer model traced lazily is a graph with
12 copies of the layer, forward and backward, and compiling it takes about 12
times as long as one layer. ``torch_xla.experimental.scan`` puts one layer in
an XLA ``While`` loop over the layers' stacked weights, so the compiler sees
it once.

The transform keeps the model as the user wrote it. In a shallow copy of the
module tree (same tensors), each named ``nn.ModuleList`` or ``nn.Sequential``
becomes a :class:`xlapipe.layer_scan.ScannedLayers`: the owner's loop runs
unchanged, and the stack runs as one scan when its last layer is called (see
that module for how the loop is checked). Parameters keep their names and
stay separate tensors, so the optimizer, checkpoints and copy-on-move placement
see the same model; each step stacks them for the scan.

``layers`` names the stacks by module path (``"bert.encoder.layer"``). By
default it finds transformers' ``BertEncoder.layer`` and ``GPT2Model.h``.
"""

from __future__ import annotations

import types
from typing import Any, cast

import torch
from attrs import frozen
from torch import nn
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

from xlapipe import claims
from xlapipe.claims import Claim
from xlapipe.hooks import Context, Hook
from xlapipe.layer_scan import ScannedLayers, scanned_class
from xlapipe.placement import copy_tree
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, practice, register
from xlapipe.transforms.compile_step import CorrectNativeDropout

# transformers classes whose forward is a plain chain over one of their lists.
KNOWN_STACKS = (("BertEncoder", "layer"), ("GPT2Model", "h"))
# Attributes a layer may hold that differ between layers without changing what it
# computes (``layer_idx`` picks a layer's slot in a KV cache, which scanning refuses).
PER_LAYER_ATTRIBUTES = frozenset({"layer_idx"})
PLAIN = (type(None), bool, int, float, str, torch.dtype)


def _known_stacks(model: nn.Module) -> list[str]:
    found = []
    for path, module in model.named_modules():
        for cls in type(module).__mro__:
            attr = dict(KNOWN_STACKS).get(cls.__name__)
            if (
                attr
                and cls.__module__.startswith("transformers.")
                and isinstance(module._modules.get(attr), nn.ModuleList)
            ):
                found.append(f"{path}.{attr}" if path else attr)
                break
    return found


def _candidates(model: nn.Module) -> list[str]:
    """Lists and sequences of two or more modules in ``model``, for the refusal messages."""
    return [
        path
        for path, m in model.named_modules()
        if type(m) in (nn.ModuleList, nn.Sequential) and len(m) >= 2 and path
    ]


def _stack(model: nn.Module, path: str) -> nn.Module:
    try:
        stack = model.get_submodule(path)
    except AttributeError:
        stack = None
    if stack is None:
        listed = ", ".join(map(repr, _candidates(model))) or "none"
        raise ValueError(
            f"scan_layers: the model ({type(model).__name__}) has no module at {path!r}. Name an "
            f"nn.ModuleList or nn.Sequential of identical layers by its path; candidates: {listed}."
        )
    if isinstance(stack, ScannedLayers):
        raise ValueError(f"scan_layers: {path!r} is scanned already; apply scan_layers to the user's model")
    if type(stack) not in (nn.ModuleList, nn.Sequential):
        raise TypeError(
            f"scan_layers: {path!r} is a {type(stack).__name__}; scan_layers scans an nn.ModuleList or "
            "nn.Sequential of identical layers. Name the list that holds the layers."
        )
    count = len(cast("nn.ModuleList | nn.Sequential", stack))  # the type was checked just above
    if count < 2:
        raise ValueError(f"scan_layers: {path!r} holds {count} layer(s); there is nothing to scan.")
    return stack


def _shown(value: Any) -> tuple[Any, str]:
    """``(what to compare, what to print)`` for one attribute value of a layer's module."""
    if isinstance(value, PLAIN) or (isinstance(value, tuple) and all(isinstance(v, PLAIN) for v in value)):
        return value, repr(value)
    if isinstance(value, torch.Tensor):  # a tensor that is not a parameter or buffer: the same one
        return ("tensor", id(value)), f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, types.MethodType):
        value = value.__func__
    if callable(value) and hasattr(value, "__qualname__"):  # functions: the same object
        module = getattr(value, "__module__", None) or ""
        name = value.__name__ if isinstance(value, types.BuiltinFunctionType) else value.__qualname__
        return ("function", id(value)), f"{module + '.' if module else ''}{name}"
    return ("object", type(value)), f"a {type(value).__name__}"  # objects: of the same type


def _describe(layer: nn.Module) -> dict[str, dict[str, tuple[Any, str]]]:
    """What a layer is made of besides its weights' values: ``{part: {name: (compared, shown)}}``."""

    def dotted(prefix: str, name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    out: dict[str, dict[str, tuple[Any, str]]] = {
        "modules": {},
        "parameters": {},
        "buffers": {},
        "attributes": {},
    }
    for path, m in layer.named_modules():
        out["modules"][path or "(the layer)"] = (type(m), type(m).__qualname__)
        for name, value in sorted(vars(m).items()):
            if not name.startswith("_") and name not in PER_LAYER_ATTRIBUTES:
                out["attributes"][dotted(path, name)] = _shown(value)
    for name, p in layer.named_parameters():
        out["parameters"][name] = (
            (tuple(p.shape), p.dtype, p.requires_grad),
            f"{tuple(p.shape)} {str(p.dtype).replace('torch.', '')}" + ("" if p.requires_grad else " frozen"),
        )
    for name, b in layer.named_buffers():
        out["buffers"][name] = (
            (tuple(b.shape), b.dtype),
            f"{tuple(b.shape)} {str(b.dtype).replace('torch.', '')}",
        )
    return out


def check_identical(path: str, stack: nn.Module) -> None:
    """Refuse a stack whose layers differ in anything but their weights' values."""
    layers = cast("list[nn.Module]", list(stack._modules.values()))  # a ModuleList/Sequential's layers
    reference = _describe(layers[0])
    for i, layer in enumerate(layers[1:], 1):
        described = _describe(layer)
        for part, ref in reference.items():
            mine = described[part]
            for name in list(ref) + [n for n in mine if n not in ref]:
                a, b = ref.get(name), mine.get(name)
                if a is None or b is None or a[0] != b[0]:
                    raise ValueError(
                        f"scan_layers: layer {i} of {path!r} differs from layer 0 in its {part}: {name} is "
                        f"{b[1] if b else 'absent'} where layer 0 has {a[1] if a else 'none'}. A scan runs one "
                        "layer's computation for every layer, so only the weights' values may differ. "
                        f"Leave {path!r} out of scan_layers(layers=...)."
                    )


def _scan(setup: TrainingSetup, layers: tuple[str, ...] | None) -> TrainingSetup:
    model = setup.module
    paths = list(layers) if layers else _known_stacks(model)
    if not paths:
        listed = ", ".join(map(repr, _candidates(model))) or "none"
        raise ValueError(
            f"scan_layers found no stack of layers to scan in {type(model).__name__} (it finds "
            "transformers' BertEncoder.layer and GPT2Model.h by itself). Name the nn.ModuleList or "
            f"nn.Sequential of identical layers: scan_layers(layers=('path.to.list',)); candidates: {listed}."
        )
    for path in paths:
        check_identical(path, _stack(model, path))
    for a in paths:
        for b in paths:
            if a != b and b.startswith(a + "."):
                raise ValueError(
                    f"scan_layers: {b!r} lies inside {a!r}; name each stack once, not nested ones."
                )
    copy = copy_tree(model)  # the user's modules are never changed
    for path in paths:
        stack = copy.get_submodule(path)
        stack.__class__ = scanned_class(type(stack))
        cast(ScannedLayers, stack)._scan_path = path
    return setup.evolve(model=MpModelWrapper(copy) if isinstance(setup.model, MpModelWrapper) else copy)


def _draws_random_numbers(layer: nn.Module) -> bool:
    """Whether ``layer`` holds a dropout with p > 0 (a module, or a dropout rate of an attention's)."""
    for module in layer.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float) and value > 0:
                return True
    return False


@frozen
class ScanLayers(Hook):
    """The practice's parameters and its hook: refuse a checkpoint that could not resume exactly
    (a scanned layer with dropout)."""

    layers: tuple[str, ...] | None

    def start(self, run: Context) -> Hook:
        return _Scanned(run)


class _Scanned(Hook):
    def __init__(self, run: Context) -> None:
        self.run = run

    def before_save(self) -> None:
        stacks = [m for m in self.run.model.modules() if isinstance(m, ScannedLayers)]
        if self.run.model.training and any(_draws_random_numbers(m) for m in stacks):
            raise ValueError(
                "checkpoint.save under scan_layers with dropout in the scanned layers: torch_xla 2.9's "
                "scan draws the layers' random numbers in a way a resumed run does not repeat (measured: "
                "losses 0.03 off the uninterrupted run's after a resume, and saving itself changed the "
                "run), so this checkpoint could not resume exactly. Train the scanned layers without "
                "dropout (p=0), or drop scan_layers to checkpoint this run"
            )


@register
def scan_layers(layers: str | tuple[str, ...] | None = None) -> Transform:
    """Run each named stack of identical layers as one ``torch_xla`` scan (one layer compiled).

    ``layers``: module paths of ``nn.ModuleList``/``nn.Sequential`` stacks; by
    default transformers' ``BertEncoder.layer`` and ``GPT2Model.h`` wherever they are.
    """
    if isinstance(layers, str):
        layers = (layers,)
    if layers is not None and (
        not isinstance(layers, tuple) or not layers or not all(isinstance(p, str) and p for p in layers)
    ):
        raise ValueError(
            f"scan_layers: layers must be None (find transformers' stacks) or module paths as strings, "
            f"e.g. ('bert.encoder.layer',); got {layers!r}"
        )
    return practice(
        "scan_layers",
        ScanLayers(layers),
        _scan,
        # torch_xla's scan builds an XLA While loop: it runs on the XLA device only.
        needs=("with_device",),
        # compile_step(backend='openxla') excludes scan_layers (its reasons say why); the
        # torch_xla backend runs the scanned step.
        excludes=("shard_data",),
        # AOTAutograd traces the scanned layer, and lowers dropout to aten::native_dropout, whose
        # torch_xla 2.9 kernel is wrong (see compile_step) and breaks scan's While loop.
        effects=(CorrectNativeDropout(),),
        reasons={
            "shard_data": "under SPMD torch_xla 2.9's scan shards its gradients with shard_as, which "
            "imports jax ('No module named 'jax''); remove one of them",
        },
    )


claims.declare(
    Claim(
        "scan_layers",
        lambda: scan_layers("layers"),
        refuses=[claims.Refusal("!layer_stack", "has no module at 'layers'", when="build")],
        summary="a stack of identical layers compiled once (torch_xla's scan)",
    )
)
