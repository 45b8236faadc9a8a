"""Copy-on-move placement of modules and optimizers.

``module.to(xla)`` mutates the module it is given, replaces its parameter
objects (so an optimizer built before points at stale CPU tensors) and unties
shared weights. Here the module tree is copied shallowly, each distinct
tensor is moved once (ties survive), and the caller's module and optimizer are
left exactly as they were. Host tensors are only read, so forked replicas
keep sharing their pages.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

Mapping = dict[int, torch.Tensor]  # id(old tensor) -> new tensor


def copy_tree(module: nn.Module) -> nn.Module:
    """A new module tree sharing every tensor (and shared submodule) with ``module``."""
    memo: dict[int, nn.Module] = {}

    def visit(m: nn.Module) -> nn.Module:
        if id(m) in memo:
            return memo[id(m)]
        new = object.__new__(type(m))  # no __init__, no copy protocol: cheap
        new.__dict__.update({k: (v.copy() if isinstance(v, dict) else v) for k, v in m.__dict__.items()})
        memo[id(m)] = new
        new._modules = {k: (visit(c) if c is not None else None) for k, c in m._modules.items()}
        return new

    return visit(module)


def move(
    module: nn.Module, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> tuple[nn.Module, Mapping]:
    """Return a moved copy of ``module`` and the map from old to new parameters.

    ``dtype`` converts floating-point parameters and buffers only.
    """
    new_root = copy_tree(module)
    mapping: dict[int, torch.Tensor] = {}  # id of an old parameter or buffer -> its copy

    def convert(t: torch.Tensor) -> torch.Tensor:
        cast = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        return t.detach().to(device=device or t.device, dtype=cast, copy=True)

    for m in new_root.modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            if id(p) not in mapping:
                mapping[id(p)] = nn.Parameter(convert(p), requires_grad=p.requires_grad)
            m._parameters[name] = cast(nn.Parameter, mapping[id(p)])  # a parameter's copy is one
        for name, b in m._buffers.items():
            if b is None:
                continue
            if id(b) not in mapping:
                mapping[id(b)] = convert(b)
            m._buffers[name] = mapping[id(b)]
    return new_root, mapping


def rebind_optimizer(optimizer: torch.optim.Optimizer, mapping: Mapping) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` over the moved parameters, state moved along with them."""
    missing = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in mapping]
    if missing:
        raise ValueError(
            f"{len(missing)} of the optimizer's parameters are not in the model "
            "being moved; build the optimizer from this model's parameters "
            "(or pass a factory: optimizer=lambda params: torch.optim.AdamW(params))"
        )
    state = optimizer.state_dict()
    new = copy.copy(optimizer)
    new.__dict__ = {k: (v.copy() if isinstance(v, dict) else v) for k, v in optimizer.__dict__.items()}
    new.param_groups = [
        {**g, "params": [mapping[id(p)] for p in g["params"]]} for g in optimizer.param_groups
    ]
    new.state = defaultdict(dict)
    new.load_state_dict(state)
    return new


def build_optimizer(
    optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None,
    moved: nn.Module,
    mapping: Mapping,
) -> torch.optim.Optimizer | None:
    """The optimizer for ``moved`` (``mapping`` from :func:`move`): rebound if given, built if a factory."""
    if optimizer is None:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        return rebind_optimizer(optimizer, mapping)
    built = optimizer(moved.parameters())
    if not isinstance(built, torch.optim.Optimizer):
        what = "None" if built is None else f"a {type(built).__module__}.{type(built).__qualname__}"
        raise TypeError(
            f"the optimizer factory returned {what}, not a "
            "torch.optim.Optimizer; it must build one on the parameters it is given and return it, e.g. "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=2e-5)"
        )
    own = {id(p) for p in moved.parameters()}
    foreign = sum(id(p) not in own for g in built.param_groups for p in g["params"])
    if foreign:
        raise ValueError(
            f"the optimizer factory returned an optimizer over {foreign} parameters that are not the "
            "run's: it must build the optimizer on the parameters it is given (the run's copy of the "
            "model), e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=2e-5), not return one "
            "built on your model"
        )
    return built
