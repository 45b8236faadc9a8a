"""The run: a realised setup, what the user trains, evaluates and takes the weights back from."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
from attrs import define, field
from torch import nn

from xlapipe import runtime
from xlapipe.batches import to_device
from xlapipe.hooks import Hook
from xlapipe.loader_position import Tracked
from xlapipe.precision import Precision
from xlapipe.step import LossFn, Stepper
from xlapipe.training_setup import TrainingSetup
from xlapipe.user_optimizer import Follower

H = TypeVar("H", bound=Hook)


@define(eq=False)
class Run:
    """A realised setup: the model on its device, the optimizer and scheduler built for it.

    ``steps`` counts training steps (micro-batches), ``updates`` optimizer
    updates, ``epoch`` the training epochs finished (so a restored run knows
    where it is: ``for epoch in range(run.epoch, epochs)``); ``updated`` says
    whether the last step updated the weights (Accelerate's ``sync_gradients``),
    or after ``end_epoch`` whether it applied a partial window.
    ``values`` holds the last step's named values (``loss``, and ``grad_norm``
    when clipping) as device tensors: reading one forces the device to finish
    the step (``log_every`` reads them without that).
    """

    setup: TrainingSetup
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    loaders: dict[str, Any]
    device: torch.device
    precision: Precision
    scaler: torch.amp.GradScaler | None
    hooks: tuple[Hook, ...] = ()
    values: dict[str, Any] = field(factory=dict)
    failed: bool = False  # the session is ending because the code inside it raised
    _open: bool = True
    _stepper: Stepper | None = None
    _follower: Follower | None = None
    _hook_names: tuple[str, ...] = ()  # the practice each hook belongs to (its key in a checkpoint)
    _kept: dict[str, torch.Tensor] | None = None  # the weights kept when the session failed
    _lost: str | None = None  # why they could not be kept

    def __attrs_post_init__(self) -> None:
        self._stepper = Stepper(self)

    def started(self, hooks: tuple[Hook, ...], names: tuple[str, ...]) -> None:
        """The run's hooks have started (``names``: the practice each belongs to): the step is
        composed from them."""
        self.hooks, self._hook_names = hooks, names
        self.stepper.use(hooks)
        user = self.setup.optimizer
        if isinstance(user, torch.optim.Optimizer) and self.optimizer is not None:
            self._follower = Follower(user, self.optimizer, scheduled=self.scheduler is not None)

    @property
    def stepper(self) -> Stepper:
        if self._stepper is None:
            raise RuntimeError("this run has not started (use xlapipe.session(setup))")
        return self._stepper

    # -- training --------------------------------------------------------------------------
    def step(self, batch: Any, loss_fn: LossFn) -> torch.Tensor:
        """One training step on ``batch``: forward under the precision policy, backward, and the
        update when it is due; returns the loss, detached.

        Reading the returned loss (``float(loss)``) forces the device to finish
        the step and copy it back; to log without that, use ``log_every``.
        """
        self.check_open()
        self._before_train()
        self.follow_user_optimizer()
        loss = self.stepper.step(batch, loss_fn)
        if self._follower is not None:
            self._follower.seen_by_run()  # its scheduler may have moved the run's own values
        return loss

    @property
    def steps(self) -> int:
        return self.stepper.steps

    @property
    def updates(self) -> int:
        return self.stepper.updates

    @property
    def epoch(self) -> int:
        return self.stepper.epoch

    @property
    def window(self) -> int:
        """Micro-batches whose accumulated gradients no update has applied yet."""
        return self.stepper.window

    @property
    def updated(self) -> bool:
        """Whether the last step updated the weights (with ``accumulate_grad``, every k-th does), or,
        after :meth:`end_epoch`, whether that applied an open window (then True)."""
        return self.stepper.updated

    def mark_step(self) -> None:
        """Issue a step marker: XLA compiles (once) and runs what was traced since the last one."""
        self.stepper.mark()

    @property
    def marks_step_elsewhere(self) -> bool:
        """True when a practice places the step marker (a device loader, a compiled region)."""
        return any(h.marks_step for h in self.hooks)

    def batches(self, name: str) -> Iterator[Any]:
        """The batches of loader ``name``, on the device, one step marker each, whatever the pipeline.

        Training on them with :meth:`step` or evaluating under :meth:`evaluating`
        alike: a batch whose work no step marker has ended yet is ended before
        the next one is fetched. When the loader runs out after training on its
        batches, the epoch ends (:meth:`end_epoch`). After
        :func:`xlapipe.checkpoint.restore`, the first loop continues the epoch the
        checkpoint was saved in, at its next batch.
        """
        self.check_open()
        if name not in self.loaders:
            raise KeyError(
                f"no loader {name!r} in this run; loaders: {', '.join(map(repr, self.loaders)) or 'none'}"
            )
        loader = self.loaders[name]
        stepper = self.stepper
        own_markers = stepper.on_xla and not getattr(loader, "marks_step", False)
        steps_before = stepper.steps
        tracked = _tracked(loader)
        resumed_inside = tracked is not None and tracked.inside_epoch and stepper.steps > 0
        marked_at: int | None = None
        batches = iter(loader)
        finished = False
        try:
            for batch in batches:
                if own_markers and marked_at == stepper.markers:
                    stepper.mark()  # the previous batch's work (evaluation) is still pending
                marked_at = stepper.markers
                yield to_device(batch, self.device, self.precision.weight_dtype)
            finished = True
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # a loop left early stops the loader's workers now
            if not finished and stepper.on_xla and self._open:
                stepper.mark()  # left early: the last batch's work is not fused into what comes next
        if own_markers and marked_at == stepper.markers:
            stepper.mark()
        if stepper.steps > steps_before or resumed_inside:
            self.end_epoch()

    def end_epoch(self) -> None:
        """End an epoch of training: a window of accumulated gradients left open is applied, the
        practices are told, ``run.epoch`` counts it.

        :meth:`batches` does it when its loader runs out; call it yourself after
        an epoch you cut short or fed from elsewhere.
        """
        self.check_open()
        self._before_train()
        self.follow_user_optimizer()
        self.stepper.end_epoch()

    def follow_user_optimizer(self) -> None:
        """Take what the user changed on their own optimizer since the last step into the run's
        (before a step, an end of epoch, and a save: a rate halved after an epoch is in the checkpoint)."""
        if self._follower is not None:
            self._follower.sync()

    def _before_train(self) -> None:
        for hook in self.hooks:
            hook.before_train()  # a practice may refuse training now, before anything changes

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
            if self.stepper.on_xla:
                self.stepper.mark()

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
        if self.device.type == "xla" and runtime.world_size() > 1:
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

    # -- what a checkpoint carries ---------------------------------------------------------------
    @property
    def positions(self) -> dict[str, Tracked]:
        """Each loader's position (the run's own loaders, behind its device loaders)."""
        return {name: t for name, loader in self.loaders.items() if (t := _tracked(loader)) is not None}

    def _keyed_hooks(self) -> dict[str, Hook]:
        counts: dict[str, int] = {}
        keyed: dict[str, Hook] = {}
        for name, hook in zip(self._hook_names, self.hooks):
            index = counts[name] = counts.get(name, -1) + 1
            keyed[name if index == 0 else f"{name}[{index}]"] = hook
        return keyed

    def practice_states(self) -> dict[str, dict[str, Any]]:
        """Each practice's per-run state that a resumed run needs, by practice name (empty ones left out)."""
        return {key: state for key, hook in self._keyed_hooks().items() if (state := hook.state_dict())}

    def practices_mismatch(self, saved: Any) -> str | None:
        """Why ``saved`` practice states do not fit this run (None when they do)."""
        mine = set(self.practice_states())
        if not isinstance(saved, dict) or set(saved) != mine:
            theirs = sorted(saved) if isinstance(saved, dict) else saved
            return (
                f"the checkpoint holds the state of the practices {theirs} and this run keeps state for "
                f"{sorted(mine)}; resume with the pipeline of the run that saved it"
            )
        keyed = self._keyed_hooks()
        for key, state in saved.items():
            problem = keyed[key].state_mismatch(state)
            if problem is not None:
                return problem
        return None

    def load_practice_states(self, saved: dict[str, dict[str, Any]]) -> None:
        keyed = self._keyed_hooks()
        for key, state in saved.items():
            keyed[key].load_state_dict(state)

    def restored(self) -> None:
        """A checkpoint was put into the run (its optimizer's values are the saving run's): the
        user's optimizer takes them too."""
        if self._follower is not None:
            self._follower.restored()

    # -- the trained weights -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights as CPU tensors, in the dtypes of the user's model.

        Tied weights stay tied: keys that share a tensor in the model share
        one CPU tensor here. After a session that failed (an error, Ctrl-C),
        the weights of the last completed step, kept when it ended.
        """
        if not self._open and self.failed:
            if self._kept is None:
                raise RuntimeError(f"this run's weights were not kept when its session failed: {self._lost}")
            return dict(self._kept)
        return cpu_weights(self.model, self.setup.module)

    def copy_weights_to(
        self, model: nn.Module | None = None, weights: dict[str, torch.Tensor] | None = None
    ) -> nn.Module:
        """Copy the trained weights (or ``weights``, e.g. ``xlapipe.averaged_weights(run)``) into
        ``model`` (default: the user's model) in place; return it.

        The user's model is the one given to :class:`TrainingSetup` (the
        pipeline never replaced its tensors). Shapes and names must match;
        dtypes are kept. In a replica forked by ``xlapipe.launch`` this changes
        the replica's copy: return ``run.state_dict()`` from the replica instead.
        """
        target = self.setup.module if model is None else model
        if not isinstance(target, nn.Module):
            raise TypeError(f"copy_weights_to takes a torch.nn.Module, got {type(target).__name__}")
        return load_weights(target, self.state_dict() if weights is None else weights)

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

    def keep_weights(self, error: BaseException) -> None:
        """The session failed: keep the weights of the last completed step on the CPU, if it can."""
        stepper = self._stepper
        if stepper is not None and stepper.broken is not None:
            self._lost = stepper.broken
            return
        try:
            self._kept = cpu_weights(self.model, self.setup.module)
        except Exception as reason:  # noqa: BLE001 - the device may be what failed
            self._lost = (
                f"copying them from the device failed ({type(reason).__name__}: {reason}) after the "
                f"session's {type(error).__name__}; resume from your last checkpoint"
            )

    def release(self) -> None:
        """Drop the run's device state (after a failure: its tensors may hold a failed graph)."""
        self._open = False
        if self._stepper is not None:
            self._stepper.forget()  # its counts stay readable
        self._follower = None
        self.values.clear()
        self.loaders.clear()
        self.model = nn.Module()
        self.optimizer = self.scheduler = self.scaler = None
        self.hooks = ()

    def close(self) -> None:
        """End the run: hooks closed in reverse order (all of them, even if one fails), loaders stopped."""
        if not self._open:
            return
        self._open = False
        if not self.failed and self._stepper is not None:
            self._stepper.warn_if_window_open()
        errors: list[Exception] = []
        for hook in reversed(self.hooks):
            try:
                hook.close()
            except Exception as error:  # noqa: BLE001 - the others still close; the first is raised
                errors.append(error)
        for loader in [*self.loaders.values(), *self.positions.values()]:
            close = getattr(loader, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as error:  # noqa: BLE001
                    errors.append(error)
        if errors:
            raise errors[0]


def _tracked(loader: Any) -> Tracked | None:
    inner = getattr(loader, "_loader", loader)  # behind a device loader
    return inner if isinstance(inner, Tracked) else None


def cpu_weights(model: nn.Module, user: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state as CPU tensors in the dtypes of ``user``'s (one transfer; ties kept)."""
    dtypes = {k: v.dtype for k, v in user.state_dict(keep_vars=True).items()}
    return host_copy(model.state_dict(keep_vars=True), dtypes)


def host_copy(state: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """``state`` as CPU tensors (``dtypes`` by key where given): one transfer, keys sharing a tensor
    share its copy."""
    distinct: dict[int, torch.Tensor] = {}
    for value in state.values():
        distinct.setdefault(id(value), value.detach())
    moved = dict(zip(distinct, _to_cpu(list(distinct.values()))))
    out: dict[str, torch.Tensor] = {}
    converted: dict[int, torch.Tensor] = {}
    for key, value in state.items():
        if id(value) not in converted:
            converted[id(value)] = moved[id(value)].to(dtypes.get(key, value.dtype))
        out[key] = converted[id(value)]
    return out


def _to_cpu(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    on_xla = [t for t in tensors if t.device.type == "xla"]
    if on_xla:
        import torch_xla

        torch_xla._XLAC._xla_sync_multi(on_xla, devices=[], wait=True, sync_xla_data=False)
        fetched = iter(torch_xla._XLAC._xla_get_cpu_tensors(on_xla))  # one transfer for all of them
        return [next(fetched) if t.device.type == "xla" else t.to("cpu", copy=True) for t in tensors]
    return [t.to("cpu", copy=True) for t in tensors]


def load_weights(target: nn.Module, trained: dict[str, torch.Tensor]) -> nn.Module:
    """Copy ``trained`` into ``target`` in place (names and shapes checked first); return it."""
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
