"""Layer stacks run as one ``torch_xla`` scan, with the owner's loop left as written.

:func:`xlapipe.scan_layers` swaps the class of a copied ``nn.ModuleList`` (or
``nn.Sequential``) for one that mixes in :class:`ScannedLayers`. The owner's
loop (``for layer in self.layer: h = layer(h, mask, ...)``) still runs, but
iterating or indexing the list hands out :class:`LayerCall` stand-ins instead
of the layers. The stand-ins check, call by call, that the loop is a plain
chain: each layer gets the previous layer's output as its first argument and
every other argument is the same object as the first layer's. The first
layers' calls return a :class:`Pending` placeholder; the last call runs the
whole stack at once with ``torch_xla.experimental.scan.scan`` (one layer
traced and compiled, looped N times by an XLA ``While``) and returns its
output. Whatever the loop does otherwise (reads a layer's output, passes
per-layer inputs, a KV cache, records hidden states) is refused with a
:class:`ScanLayersError` that says what and where, never computed wrongly.

The layers' parameters stay where they are (``path.3.weight`` in the state
dict and the optimizer); each step stacks them along a new first dimension for
the scan, and the gradients flow back through the stack to each layer.
"""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils import _pytree as pytree

from xlapipe.placement import copy_tree

STATIC = (type(None), bool, int, float, str, torch.dtype, torch.device)
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_STATE = "_xlapipe_scan_state"


class ScanLayersError(RuntimeError):
    """The loop over a scanned layer stack does something a scan cannot do."""


class _Chain:
    """One pass of the owner's loop over the stack: what the first layer got, how far it went."""

    def __init__(self, size: int, carry: torch.Tensor, spec: Any, leaves: list, carry_key: str):
        self.size = size
        self.carry: torch.Tensor | None = carry  # None once the pass has run (its tensors dropped)
        self.spec = spec  # pytree spec of (other positional args, keyword args)
        self.leaves = leaves
        self.carry_key = carry_key  # "" when the carry came positionally, else its keyword
        self.done = 0  # layers called so far
        self.pending: Pending | None = None


class _State:
    """Per-module mutable state, bound to the module object it was made for."""

    def __init__(self, owner: nn.Module):
        self.owner_id = id(owner)
        self.chain: _Chain | None = None
        self.fns: dict[Any, Callable] = {}  # one scanned function per (mode, autocast, static args)


class Pending:
    """What a scanned layer returns before the last layer has run: usable only as the next layer's input."""

    __slots__ = ("_index", "_where")

    def __init__(self, index: int, where: str):
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_where", where)

    def _refuse(self, what: str) -> ScanLayersError:
        return ScanLayersError(
            f"scan_layers: the output of layer {self._index} of {self._where} was used ({what}) before "
            f"the last layer ran. A scanned stack computes all its layers at once and has no per-layer "
            "outputs; it can only scan a loop that passes each layer's output straight to the next layer. "
            f"Drop scan_layers for {self._where}, or change the loop."
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        pending = next(a for a in pytree.tree_leaves((args, kwargs or {})) if isinstance(a, Pending))
        raise pending._refuse(f"in {getattr(func, '__name__', func)}")

    def __getattr__(self, name: str) -> Any:
        if name in Pending.__slots__ or name.startswith("__"):
            raise AttributeError(name)  # not set yet, or a protocol probe (copy, pickle, numpy)
        raise self._refuse(f"its attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise self._refuse(f"setting {name!r}")

    def __repr__(self) -> str:
        return f"<output of layer {self._index} of {self._where}, pending until the last layer runs>"


def _refusing(name: str) -> Callable:
    def refuse(self: Pending, *_: Any) -> Any:
        raise self._refuse(name)

    return refuse


for _op in ("add", "sub", "mul", "truediv", "matmul", "pow", "floordiv", "mod", "and", "or", "xor"):
    setattr(Pending, f"__{_op}__", _refusing(f"operator {_op}"))
    setattr(Pending, f"__r{_op}__", _refusing(f"operator {_op}"))
for _op in ("neg", "bool", "len", "iter", "getitem", "float", "int", "index", "lt", "le", "gt", "ge"):
    setattr(Pending, f"__{_op}__", _refusing(f"operator {_op}"))


class LayerCall:
    """Stands in for layer ``index`` of a scanned stack in the owner's loop."""

    __slots__ = ("_stack", "_index")

    def __init__(self, stack: ScannedLayers, index: int):
        self._stack = stack
        self._index = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stack._call(self._index, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in LayerCall.__slots__ or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._stack._layer(self._index), name)  # reading the real layer's attributes

    def __repr__(self) -> str:
        return f"LayerCall({self._stack._where}[{self._index}])"


class ScannedLayers:
    """Mixed into a copied ``nn.ModuleList``/``nn.Sequential``: its loop runs as one scan.

    ``_scan_path`` (set by :func:`xlapipe.scan_layers`) names the stack in messages.
    """

    _scan_path: str = "the stack"

    if TYPE_CHECKING:  # what the nn.ModuleList / nn.Sequential it is mixed into provides
        _modules: dict[str, nn.Module]

        def __len__(self) -> int: ...

    # -- what the owner's loop sees --------------------------------------------------

    def __iter__(self) -> Iterator[LayerCall]:
        return iter([LayerCall(self, i) for i in range(len(self))])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            raise ScanLayersError(
                f"scan_layers: {self._where} was sliced ([{_slice(index)}]); a "
                "scanned stack runs whole. Drop scan_layers for it, or loop over the whole stack."
            )
        size = len(self)
        i = index.__index__()
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of range for {self._where} of {size} layers")
        return LayerCall(self, i % size)

    def __repr__(self) -> str:
        return nn.Module.__repr__(
            cast(nn.Module, self)
        )  # ModuleList's own repr iterates, which hands out stand-ins

    # -- the chain ------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"'{self._scan_path}'"

    def _layer(self, index: int) -> nn.Module:
        return list(self._modules.values())[index]

    def _state(self) -> _State:
        state = self.__dict__.get(_STATE)
        if state is None or state.owner_id != id(self):  # fresh, or copied from another module
            state = _State(cast(nn.Module, self))
            self.__dict__[_STATE] = state
        return state

    def _call(self, index: int, args: tuple, kwargs: dict) -> Any:
        state = self._state()
        chain: _Chain | None
        try:
            if index == 0:
                state.chain = None  # an earlier pass that stopped half-way is void
                chain = state.chain = self._start(args, kwargs)
            else:
                chain = state.chain
                self._check_link(chain, index, args, kwargs)
                assert chain is not None  # _check_link refuses a pass that has not started
        except ScanLayersError:
            state.chain = None  # keep no tensor of a refused pass alive
            raise
        chain.done = index + 1
        if chain.done < chain.size:
            chain.pending = Pending(index, self._where)
            return chain.pending
        state.chain = None
        try:
            return self._scan(state, chain)
        finally:
            # Drop the chain's tensors now: a lazy tensor still referenced at the step marker
            # becomes an output of the step's graph, and a graph with other outputs compiles anew.
            chain.carry, chain.leaves, chain.pending = None, [], None

    def _start(self, args: tuple, kwargs: dict) -> _Chain:
        self._check_no_hooks()
        names = _parameters(self._layer(0))
        first = names[0] if names else ""
        if args:
            carry, rest, key = args[0], args[1:], ""
        elif first in kwargs:
            carry, rest, key = kwargs[first], (), first
            kwargs = {k: v for k, v in kwargs.items() if k != first}
        else:
            raise ScanLayersError(
                f"scan_layers: the first layer of {self._where} was called without an input"
            )
        if not isinstance(carry, torch.Tensor) or not carry.is_floating_point():
            raise ScanLayersError(
                f"scan_layers: the first layer of {self._where} got a {_kind(carry)} as its input; a scanned "
                "stack passes one floating-point tensor (the hidden states) from layer to layer."
            )
        if carry.device.type != "xla":
            raise ScanLayersError(
                f"scan_layers: {self._where} got its input on {carry.device}; torch_xla's scan runs on the "
                "XLA device only. Put with_device() in the pipeline."
            )
        leaves, spec = pytree.tree_flatten((rest, kwargs))
        for name, leaf in _named_leaves(rest, kwargs, names):
            if not isinstance(leaf, (torch.Tensor, *STATIC)):
                raise ScanLayersError(
                    f"scan_layers: every layer of {self._where} gets {name} = a {type(leaf).__name__}. "
                    + _cache_hint(leaf)
                )
        return _Chain(len(self), carry, spec, leaves, key)

    def _check_link(self, chain: _Chain | None, index: int, args: tuple, kwargs: dict) -> None:
        if chain is None or chain.done != index:
            when = "before layer 0" if chain is None else f"after layer {chain.done - 1}"
            raise ScanLayersError(
                f"scan_layers: layer {index} of {self._where} was called {when}; a scanned stack "
                f"runs its layers in order, 0 to {len(self) - 1}, each once per pass."
            )
        if chain.carry_key:
            carry = kwargs.get(chain.carry_key)
            kwargs = {k: v for k, v in kwargs.items() if k != chain.carry_key}
            rest = args
        else:
            carry, rest = (args[0], args[1:]) if args else (None, ())
        if carry is not chain.pending:
            raise ScanLayersError(
                f"scan_layers: layer {index} of {self._where} got an input that is not layer {index - 1}'s "
                f"output; a scanned stack feeds each layer's output straight to the next layer. Drop "
                f"scan_layers for {self._where}, or change the loop."
            )
        leaves, spec = pytree.tree_flatten((rest, kwargs))
        same = (
            spec == chain.spec
            and len(leaves) == len(chain.leaves)
            and all(_same(a, b) for a, b in zip(leaves, chain.leaves))
        )
        if not same:
            differs = _first_difference(chain, rest, kwargs, _parameters(self._layer(0)))
            raise ScanLayersError(
                f"scan_layers: layer {index} of {self._where} got another {differs} than layer 0. A "
                "scanned stack gives every layer the same extra inputs; per-layer inputs (a head mask per "
                "layer, a cache per layer) cannot be scanned. Drop scan_layers for "
                f"{self._where}, or pass the same inputs to every layer."
            )

    def _check_no_hooks(self) -> None:
        from torch.nn.modules import module as torch_module

        global_hooks = [
            n
            for n in (
                "_global_forward_hooks",
                "_global_forward_pre_hooks",
                "_global_backward_hooks",
                "_global_backward_pre_hooks",
            )
            if getattr(torch_module, n, None)
        ]
        if global_hooks:
            raise ScanLayersError(
                f"scan_layers: global module hooks are registered ({', '.join(global_hooks)}); a scanned "
                f"stack runs {self._where} as one traced layer, so they would not run once per layer. "
                "Remove them, or drop scan_layers."
            )
        if _recording_outputs():
            raise ScanLayersError(
                f"scan_layers: transformers is recording per-layer outputs (output_hidden_states or "
                f"output_attentions), and a scanned stack has none: {self._where} runs as one scan. Ask "
                "for the last hidden state only, or drop scan_layers."
            )
        for i, layer in enumerate(self._modules.values()):
            for name, m in layer.named_modules():
                for kind in HOOKS:
                    own = [h for h in getattr(m, kind, {}).values() if not _is_transformers_recorder(h)]
                    if own:
                        where = f"layer {i}" + (f" ({name})" if name else "")
                        raise ScanLayersError(
                            f"scan_layers: {where} of {self._where} has {kind.strip('_').replace('_', ' ')}; "
                            "a scanned stack runs as one traced layer, so module hooks would not run once "
                            "per layer. Remove the hooks, or drop scan_layers."
                        )

    # -- the scan ---------------------------------------------------------------------------

    def _scan(self, state: _State, chain: _Chain) -> torch.Tensor:
        from torch_xla.experimental.scan import scan

        layers = list(self._modules.values())
        modes = {m.training for layer in layers for m in layer.modules()}
        if len(modes) > 1:
            raise ScanLayersError(
                f"scan_layers: the layers of {self._where} are in different modes (some train(), some "
                "eval()); a scanned stack runs every layer as the first one. Set one mode for the model."
            )
        stats = [
            f"layer {i} ({name})"
            for i, layer in enumerate(layers)
            for name, m in layer.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats
        ]
        if stats:
            raise ScanLayersError(
                f"scan_layers: {stats[0]} of {self._where} updates running statistics in training "
                f"({type(layers[0]).__name__} holds batch norm); a scan cannot write a layer's buffers "
                "in place. Drop scan_layers for it, or use a norm without running statistics "
                "(LayerNorm, or BatchNorm with track_running_stats=False)."
            )
        statics = tuple((i, v) for i, v in enumerate(chain.leaves) if not isinstance(v, torch.Tensor))
        tensors = [v for v in chain.leaves if isinstance(v, torch.Tensor)]
        key = (layers[0].training, _autocast_state(), chain.spec, chain.carry_key, statics)
        fn = state.fns.get(key)
        if fn is None:
            fn = state.fns[key] = _one_layer(layers[0], chain, statics, len(chain.leaves), self._where)
        n = len(layers)
        params = _stacked([dict(layer.named_parameters()) for layer in layers])
        buffers = _stacked([dict(layer.named_buffers()) for layer in layers])
        extras = [t.unsqueeze(0).expand(n, *t.shape) for t in tensors]
        xs: tuple = (params, buffers, extras)
        carry = chain.carry
        assert carry is not None  # the pass is running: its carry is still held
        if not (params or buffers or extras):  # scan needs something to slice per layer
            xs += (torch.zeros(n, device=carry.device),)
        out, _ = scan(fn, carry, xs, is_fn_pure=True)
        return out


def _one_layer(first: nn.Module, chain: _Chain, statics: tuple, count: int, where: str) -> Callable:
    """``fn(carry, (params, buffers, extras)) -> (layer(carry, ...), None)`` over a hook-free copy of ``first``."""
    template = copy_tree(first)
    for m in template.modules():
        for kind in HOOKS + (
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
            "_forward_pre_hooks_with_kwargs",
        ):
            if kind in m.__dict__:
                m.__dict__[kind] = OrderedDict()
    spec, carry_key = chain.spec, chain.carry_key
    static = dict(statics)

    def one_layer(carry: torch.Tensor, x: tuple) -> tuple[torch.Tensor, None]:
        params, buffers, extras = x[:3]
        supplied = iter(extras)
        leaves = [static[i] if i in static else next(supplied) for i in range(count)]
        rest, kwargs = pytree.tree_unflatten(leaves, spec)
        if carry_key:
            call_args, kwargs = tuple(rest), {**kwargs, carry_key: carry}
        else:
            call_args = (carry, *rest)
        out = torch.func.functional_call(template, {**params, **buffers}, call_args, kwargs, strict=True)
        if not isinstance(out, torch.Tensor) or out.shape != carry.shape or out.dtype != carry.dtype:
            raise ScanLayersError(
                f"scan_layers: a layer of {where} returns {_kind(out)} for an input of shape "
                f"{tuple(carry.shape)} ({carry.dtype}); a scanned layer must return a tensor of the shape and "
                "dtype it takes (the next layer's input)."
            )
        return out, None

    return one_layer


def _stacked(per_layer: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([d[name] for d in per_layer]) for name in per_layer[0]}


def _autocast_state() -> tuple:
    return (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"))


def _parameters(layer: nn.Module) -> list[str]:
    """The names of ``layer.forward``'s parameters, in order (empty when it has no signature)."""
    import inspect

    try:
        return list(inspect.signature(layer.forward).parameters)
    except (TypeError, ValueError):
        return []


def _named_leaves(rest: tuple, kwargs: dict, names: list[str]) -> Iterator[tuple[str, Any]]:
    """``(name, leaf)`` for every leaf of the other arguments; positional ones named by the signature."""
    for i, arg in enumerate(rest):
        name = (
            repr(names[i + 1])
            if i + 1 < len(names) and not names[i + 1].startswith("*")
            else (f"positional argument {i + 1}")
        )
        for leaf in pytree.tree_leaves(arg):
            yield name, leaf
    for name, arg in kwargs.items():
        for leaf in pytree.tree_leaves(arg):
            yield repr(name), leaf


def _same(a: Any, b: Any) -> bool:
    """One layer's argument is the same as the first layer's: the same tensor, or an equal plain value."""
    return a is b or (not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b)


def _first_difference(chain: _Chain, rest: tuple, kwargs: dict, names: list[str]) -> str:
    first_rest, first_kwargs = pytree.tree_unflatten(chain.leaves, chain.spec)
    before = dict(_named_leaves(first_rest, first_kwargs, names))
    now = dict(_named_leaves(rest, kwargs, names))
    for name in list(before) + [n for n in now if n not in before]:
        if name not in before or name not in now:
            return f"set of arguments ({name} {'missing' if name not in now else 'added'})"
        a, b = before[name], now[name]
        if not _same(a, b):
            return f"{name}"
    return "argument structure"


def _slice(index: slice) -> str:
    parts = ["" if v is None else str(v) for v in (index.start, index.stop, index.step)]
    return ":".join(parts[:2] if index.step is None else parts)


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _cache_hint(value: Any) -> str:
    if "Cache" in type(value).__name__:
        return (
            "A KV cache is filled layer by layer and a scanned stack cannot honour it. When training, "
            "pass use_cache=False to the model in the loss function (or set model.config.use_cache = "
            "False), or drop scan_layers."
        )
    return (
        "A scanned stack passes tensors and plain values (None, numbers, strings) to its layers, "
        "nothing else. Drop scan_layers for this stack."
    )


def _recording_outputs() -> bool:
    capture = sys.modules.get("transformers.utils.output_capturing")
    if capture is None:
        return False
    collector = getattr(capture, "_active_collector", None)
    collected = collector.get() if collector is not None else None
    return collected is not None and bool(collected) and any(not k.startswith("_") for k in collected)


def _is_transformers_recorder(hook: Any) -> bool:
    """transformers' output-recording hooks, inert unless outputs are being recorded (checked apart)."""
    fn = getattr(hook, "__func__", hook)
    return getattr(fn, "__module__", "") == "transformers.utils.output_capturing"


_CLASSES: dict[type, type] = {}


def scanned_class(container: type) -> type:
    """The class a copied ``container`` (``nn.ModuleList`` or ``nn.Sequential``) becomes."""
    if container not in _CLASSES:
        _CLASSES[container] = types.new_class(f"Scanned{container.__name__}", (ScannedLayers, container))
    return _CLASSES[container]
