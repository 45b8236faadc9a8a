"""The run: a realised setup, what the user trains, evaluates and takes the weights back from."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from attrs import define, field
from torch import nn
from torch_xla.distributed.parallel_loader import MpDeviceLoader

from xlapipe import runtime
from xlapipe.batches import to_device
from xlapipe.hooks import Hook, Step
from xlapipe.precision import Precision
from xlapipe.step import compose, train_step
from xlapipe.training_setup import TrainingSetup

LossFn = Callable[[nn.Module, Any], torch.Tensor]
H = TypeVar("H", bound=Hook)


@define(eq=False)
class Run:
    """A realised setup: the model on its device, the optimizer and scheduler built for it.

    ``steps`` counts training steps (micro-batches) and ``updates`` optimizer
    updates; ``values`` holds the last step's named values (``loss``, and
    ``grad_norm`` when clipping) as device tensors: reading one forces the
    device to finish the step (``log_every`` reads them without that).
    """

    setup: TrainingSetup
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    loaders: dict[str, Iterable]
    device: torch.device
    precision: Precision
    scaler: torch.amp.GradScaler | None
    hooks: tuple[Hook, ...] = ()
    steps: int = 0
    updates: int = 0
    values: dict[str, Any] = field(factory=dict)
    failed: bool = False  # the session is ending because the code inside it raised
    _open: bool = True
    _markers: int = 0  # step markers this run issued itself
    _composed: tuple[LossFn, Step] | None = None

    # -- training --------------------------------------------------------------------------
    def step(self, batch: Any, loss_fn: LossFn) -> torch.Tensor:
        """One training step; see :func:`xlapipe.step.train_step`."""
        return train_step(self, batch, loss_fn)

    def composed_step(self, loss_fn: LossFn) -> Step:
        """The step for ``loss_fn`` with every hook in place (built once per loss function)."""
        if self._composed is None or self._composed[0] is not loss_fn:
            self._composed = (loss_fn, compose(self, loss_fn))
        return self._composed[1]

    def mark_step(self) -> None:
        """Issue a step marker: XLA compiles (once) and runs what was traced since the last one."""
        import torch_xla

        torch_xla.sync()
        self._markers += 1

    @property
    def marks_step_elsewhere(self) -> bool:
        """True when a practice places the step marker (a device loader, a compiled region)."""
        return any(h.marks_step for h in self.hooks)

    loader_syncs = marks_step_elsewhere  # the name before practices could mark steps in other ways

    def batches(self, name: str) -> Iterator[Any]:
        """The batches of loader ``name``, on the device, one step marker each, whatever the pipeline.

        Training on them with :meth:`step` or evaluating under :meth:`evaluating`
        alike: a batch whose work no step marker has ended yet is ended before
        the next one is fetched. When the loader runs out after training on its
        batches, the practices are told the epoch ended (e.g. accumulated
        gradients are applied).
        """
        self.check_open()
        if name not in self.loaders:
            raise KeyError(
                f"no loader {name!r} in this run; loaders: {', '.join(map(repr, self.loaders)) or 'none'}"
            )
        loader = self.loaders[name]
        on_xla = self.device.type == "xla"
        own_markers = on_xla and not isinstance(loader, MpDeviceLoader)
        steps_before = self.steps
        marked_at: int | None = None
        batches = iter(loader)
        finished = False
        try:
            for batch in batches:
                if own_markers and marked_at == self._markers:
                    self.mark_step()  # the previous batch's work (evaluation) is still pending
                marked_at = self._markers
                yield to_device(batch, self.device, self.precision.weight_dtype)
            finished = True
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # a loop left early stops the loader's workers now
            if not finished and on_xla and self._open:
                self.mark_step()  # left early: the last batch's work is not fused into what comes next
        if own_markers and marked_at == self._markers:
            self.mark_step()
        if self.steps > steps_before:
            self.end_epoch()

    def end_epoch(self) -> None:
        """Tell the practices an epoch of training ended (e.g. accumulated gradients are applied).

        :meth:`batches` does it when its loader runs out; call it yourself after
        an epoch you cut short or fed from elsewhere.
        """
        self.check_open()
        for hook in self.hooks:
            hook.end_epoch()
        if self.device.type == "xla":
            self.mark_step()

    # -- between steps -----------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context for forward passes outside :meth:`step`."""
        return self.precision.autocast(self.device)

    @contextlib.contextmanager
    def outside_step(self) -> Iterator[None]:
        """Work between steps (evaluation, logging): practices set it aside (e.g. the recompile guard).

        On the XLA device, what the block traced is executed when it ends, so
        it is never blamed on the next training step.
        """
        self.check_open()
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.outside_step())
            yield
            if self.device.type == "xla":
                self.mark_step()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Evaluation mode: ``model.eval()``, no gradients, the precision policy, outside the step.

        >>> with run.evaluating():
        ...     for batch in run.batches("eval"):
        ...         correct += (run.model(batch["x"]).argmax(-1) == batch["y"]).sum()
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.autocast(), self.outside_step():
                yield
        finally:
            self.model.train(was_training)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` from every replica, concatenated along dim 0 (Accelerate's ``gather``).

        With one replica (or SPMD, one process over every device) it is ``tensor``.
        """
        if self.device.type == "xla":
            if runtime.world_size() > 1:
                import torch_xla.core.xla_model as xm

                return xm.all_gather(tensor, dim=0)
        return tensor

    @property
    def is_main(self) -> bool:
        """True in the replica that should print and write (global ordinal 0)."""
        if self.device.type != "xla":
            return True
        import torch_xla.runtime as xr

        return bool(xr.global_ordinal() == 0)

    def hook(self, kind: type[H]) -> H | None:
        """This run's part of the practice whose hooks are of type ``kind`` (None if absent)."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    # -- the trained weights -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights as CPU tensors, in the dtypes of the user's model.

        Tied weights stay tied: keys that share a tensor in the model share
        one CPU tensor here.
        """
        user = self.setup.module.state_dict(keep_vars=True)
        copies: dict[int, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        for key, value in self.model.state_dict(keep_vars=True).items():
            if id(value) not in copies:
                dtype = user[key].dtype if key in user else value.dtype
                copies[id(value)] = value.detach().to("cpu", dtype)
            out[key] = copies[id(value)]
        return out

    def copy_weights_to(self, model: nn.Module | None = None) -> nn.Module:
        """Copy the trained weights into ``model`` (default: the user's model) in place; return it.

        The user's model is the one given to :class:`TrainingSetup` (the
        pipeline never replaced its tensors). Shapes and names must match;
        dtypes are kept. In a replica forked by ``xlapipe.launch`` this changes
        the replica's copy: return ``run.state_dict()`` from the replica instead.
        """
        target = self.setup.module if model is None else model
        if not isinstance(target, nn.Module):
            raise TypeError(f"copy_weights_to takes a torch.nn.Module, got {type(target).__name__}")
        trained = self.state_dict()
        mine = target.state_dict(keep_vars=True)
        missing, unexpected = sorted(set(trained) - set(mine)), sorted(set(mine) - set(trained))
        if missing or unexpected:
            raise ValueError(
                "copy_weights_to: the model does not have the run's parameters and buffers "
                f"(not in it: {missing[:5]}; not in the run: {unexpected[:5]}); give the model "
                "the setup was built from, or one of the same architecture"
            )
        wrong = [k for k, t in mine.items() if t.shape != trained[k].shape]
        if wrong:
            raise ValueError(f"copy_weights_to: shapes differ for {wrong[:5]}; nothing was copied")
        with torch.no_grad():
            for key, tensor in mine.items():
                tensor.copy_(trained[key])
        return target

    # -- life cycle -----------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self._open

    def check_open(self) -> None:
        if not self._open:
            raise RuntimeError(
                "this run's session has ended: its hooks are closed and its effects undone. "
                "Train inside `with xlapipe.session(setup) as run:`, or start a new session."
            )

    def release(self) -> None:
        """Drop the run's device state (after a failure: its tensors may hold a failed graph)."""
        self._open = False
        self._composed = None
        self.values.clear()
        self.loaders.clear()
        self.model = nn.Module()
        self.optimizer = self.scheduler = self.scaler = None
        self.hooks = ()

    def close(self) -> None:
        """End the run: hooks closed in reverse order (all of them, even if one fails)."""
        if not self._open:
            return
        self._open = False
        self._composed = None
        errors = []
        for hook in reversed(self.hooks):
            try:
                hook.close()
            except Exception as error:  # noqa: BLE001 - the others still close; the first is raised
                errors.append(error)
        if errors:
            raise errors[0]
