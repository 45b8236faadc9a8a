"""The training setup: one immutable value that every transform maps to a new one.

It holds what the user built (model, optimizer, scheduler, loaders) and the
decisions transforms took (device, precision, effects still to apply, hooks
into the session and the step, the transforms applied). Nothing in it is
moved or applied until :func:`xlapipe.session` realises it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import torch
from attrs import field, frozen
from attrs.validators import instance_of
from torch import nn
from torch_xla.distributed.xla_multiprocessing import MpModelWrapper

from xlapipe.effects import Effect
from xlapipe.hooks import Hook
from xlapipe.precision import Precision

if TYPE_CHECKING:  # xlapipe.transform imports this module when it applies
    from xlapipe.transform import Params


class Applied(Protocol):
    """A transform as the setup records it (an :class:`xlapipe.Transform`)."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Params: ...

    @property
    def effects(self) -> tuple[Effect, ...]: ...

    @property
    def hooks(self) -> tuple[Hook, ...]: ...


def _applied(items: Iterable[Applied]) -> tuple[Applied, ...]:
    return tuple(items)


OptimizerSpec = torch.optim.Optimizer | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


def _check_model(_: object, __: object, value: Any) -> None:
    if not isinstance(value, (nn.Module, MpModelWrapper)):
        raise TypeError(f"model must be a torch.nn.Module, got {type(value).__name__}")


def _check_optimizer(_: object, __: object, value: Any) -> None:
    if value is not None and not isinstance(value, torch.optim.Optimizer) and not callable(value):
        raise TypeError(
            "optimizer must be a torch.optim.Optimizer, a function from parameters "
            f"to one, or None; got {type(value).__name__}"
        )


def _check_scheduler(_: object, __: object, value: Any) -> None:
    if value is None or isinstance(value, type) or (callable(value) and not hasattr(value, "state_dict")):
        return
    raise TypeError(
        "scheduler must be a function of the optimizer that builds the scheduler, e.g. "
        "scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt, ...); got "
        f"{type(value).__name__}. xlapipe builds it on the run's optimizer (the one on the "
        "device), so a scheduler built on your own optimizer would schedule nothing."
    )


def _check_device(_: object, __: object, value: object) -> None:
    if value not in ("cpu", "xla"):
        raise ValueError(
            f"device must be 'cpu' or 'xla', got {value!r}; with_device() chooses the "
            "XLA device (a TPU, or the CPU runtime when PJRT_DEVICE=CPU)"
        )


def _freeze_loaders(value: Mapping[str, Iterable] | None) -> Mapping[str, Iterable]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError(
            f"loaders must be a mapping of names to data loaders, e.g. "
            f"{{'train': loader}}; got {type(value).__name__}"
        )
    for name, loader in value.items():
        if not isinstance(name, str):
            raise TypeError(f"loader names must be strings, got {name!r}")
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader {name!r} is not iterable ({type(loader).__name__})")
    return MappingProxyType(dict(value))


@frozen
class TrainingSetup:
    """Model, optimizer, scheduler, named loaders and the decisions taken about them.

    ``optimizer`` is an optimizer over the model's parameters or a function of
    the parameters that builds one; ``scheduler`` is a function of the
    optimizer that builds a learning-rate scheduler, stepped after every
    optimizer update (one whose ``step`` needs a metric, ``ReduceLROnPlateau``,
    is stepped by you: ``run.scheduler.step(val_loss)``). Both are rebuilt on
    the run's own copy of the model. The effects and hooks still to apply are
    those of the transforms applied (``applied``), in their order.
    """

    model: nn.Module | MpModelWrapper = field(validator=_check_model)
    optimizer: OptimizerSpec = field(default=None, validator=_check_optimizer)
    loaders: Mapping[str, Iterable] = field(factory=dict, converter=_freeze_loaders)
    scheduler: SchedulerFactory | None = field(default=None, validator=_check_scheduler, kw_only=True)
    device: str = field(default="cpu", validator=_check_device, kw_only=True)
    precision: Precision = field(factory=Precision, validator=instance_of(Precision), kw_only=True)
    applied: tuple[Applied, ...] = field(default=(), converter=_applied, kw_only=True)
    # The setup before the first transform (None for it): what a harness re-applies another pipeline to.
    origin: TrainingSetup | None = field(default=None, eq=False, repr=False, kw_only=True)

    def evolve(self, **changes: Any) -> TrainingSetup:
        """A copy with ``changes``; validators run again."""
        return attrs.evolve(self, **changes)

    def record(self, name: str) -> Params | None:
        """The parameters ``name`` was applied with, or None if it was not."""
        return next((t.params for t in self.applied if t.name == name), None)

    @property
    def module(self) -> nn.Module:
        """The model itself: unwrapped when ``wrap_model_mp`` put it in an ``MpModelWrapper``."""
        return self.model._model if isinstance(self.model, MpModelWrapper) else self.model

    @property
    def effects(self) -> tuple[Effect, ...]:
        """The process-wide effects the applied transforms record, in their order."""
        return tuple(e for t in self.applied for e in t.effects)

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The hooks the applied transforms record, in their order (the order the session calls them)."""
        return tuple(h for t in self.applied for h in t.hooks)

    @property
    def base(self) -> TrainingSetup:
        """The setup as the user built it, before any transform."""
        return self if self.origin is None else self.origin

    @property
    def applied_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.applied)

    def summary(self) -> dict:
        """Plain data describing the setup's decisions (not its tensors)."""
        return {
            "model": type(self.model).__name__,
            "optimizer": type(self.optimizer).__name__,
            "scheduler": None if self.scheduler is None else getattr(self.scheduler, "__name__", "scheduler"),
            "loaders": {k: type(v).__name__ for k, v in sorted(self.loaders.items())},
            "device": self.device,
            "precision": attrs.asdict(self.precision),
            "effects": [e.describe() for e in self.effects],
            "hooks": [h.describe() for h in self.hooks],
            "applied": list(self.applied_names),
        }
