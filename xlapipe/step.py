"""The training step and its one owner: forward, backward, the update window and the step marker.

A step is forward (under the precision policy) and backward on one micro-batch,
whose gradients join the *window* of micro-batches no update has applied yet.
Whether the window is applied now is asked of the practices
(``Hook.update_due``; without accumulation, every micro-batch updates). An
update, wherever it is started (a step, or the end of an epoch's partial
window), goes through one path::

    apply       = wrap_apply( reduce gradients across replicas, divide them by the window's divisor,
                              unscale (fp16), on_gradients hooks, optimizer step, scaler update )
    then          zero the gradients, step the scheduler, after_update hooks

The divisor is the window's length (its average) unless a practice says
otherwise (``Hook.window_divisor``). ``updated`` is True after a step or an
end of epoch that applied an update. Then exactly one step marker, unless a
hook places it (``Hook.marks_step``).
Practices change the step only through :mod:`xlapipe.hooks`; nothing here
knows any practice by name.

Failures: a step that fails before its update (the loss function raised, or
Ctrl-C) leaves the window as it was before it: its gradients and its count.
Ctrl-C during an update is held until the update has been traced whole, so an
interrupted run keeps the weights of its last completed step. Any other error
inside an update leaves the weights part-updated: the run then refuses to
train on, and says so.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from xlapipe import runtime
from xlapipe.batches import to_device
from xlapipe.hooks import Action, Context, Forward, Hook, Step

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


class PendingGradientsWarning(RuntimeWarning):
    """A session ended with accumulated gradients that no update applied."""


class WrapperError(RuntimeError):
    """A practice's ``wrap_*`` hook returned a function that does not call the one it wraps."""


class Stepper:
    """The one owner of a run's steps: counts, the update window, the step marker."""

    def __init__(self, run: Context) -> None:
        self.run = run
        self.hooks: tuple[Hook, ...] = ()
        self.steps = 0  # micro-batches trained
        self.updates = 0  # optimizer updates
        self.epoch = 0  # training epochs finished (run.batches loops that trained and ran out)
        self.window = 0  # micro-batches whose gradients no update has applied yet
        self.updated = False  # whether the last step, or end of epoch, applied an update
        self.markers = 0  # step markers this run issued itself
        self.broken: str | None = None  # why this run must not train on
        self.on_xla = run.device.type == "xla"
        self.replicas = runtime.world_size() if self.on_xla else 1
        self.seed = _device_seed(run.device) if self.on_xla else 0  # the XLA stream this run draws from
        self.marks_elsewhere = False
        self._composed: tuple[LossFn, Step] | None = None
        self._apply: Action | None = None
        self._scales: dict[int, torch.Tensor] = {}
        self._divisor = 1  # what the window being applied is divided by
        self._scheduler_steps = _steps_itself(run.scheduler)

    def use(self, hooks: tuple[Hook, ...]) -> None:
        """The run's started hooks: the step and the update are composed from them."""
        self.hooks = hooks
        self.marks_elsewhere = any(h.marks_step for h in hooks)
        self._composed = self._apply = None

    def forget(self) -> None:
        """Drop what holds the run's device state (the session failed); the counts stay."""
        self.hooks = ()
        self._composed = self._apply = None
        self._scales.clear()

    # -- the step ----------------------------------------------------------------------------
    def step(self, batch: Any, loss_fn: LossFn) -> torch.Tensor:
        """One step on ``batch``; the loss, detached (reading it forces the device to finish)."""
        self.check_can_train()
        if not callable(loss_fn):
            raise TypeError(
                f"loss_fn must be a function (model, batch) -> loss tensor, got {type(loss_fn).__name__}"
            )
        for hook in self.hooks:
            batch = hook.before_step(batch)
        batch = to_device(batch, self.run.device, self.run.precision.weight_dtype)
        self.run.values = {}  # a new dict per step: a reader that kept the last one keeps it whole
        loss, updated = self._step_for(loss_fn)(batch)
        self.steps += 1
        self.updated = updated
        self.run.values["loss"] = loss
        if self.on_xla and not self.marks_elsewhere:
            self.mark()
        for hook in reversed(self.hooks):
            hook.after_step(batch, loss, updated)
        for hook in self.hooks:
            hook.between_steps()
        return loss

    def check_can_train(self) -> None:
        if self.run.optimizer is None:
            raise ValueError("a training step needs an optimizer: give TrainingSetup(model, optimizer, ...)")
        if self.broken is not None:
            raise RuntimeError(self.broken)

    def _step_for(self, loss_fn: LossFn) -> Step:
        """The step for ``loss_fn`` with every hook in place (built once per loss function)."""
        if self._composed is None or self._composed[0] is not loss_fn:
            self._composed = (loss_fn, self._compose(loss_fn))
        return self._composed[1]

    def _compose(self, loss_fn: LossFn) -> Step:
        run, hooks = self.run, self.hooks

        def forward(batch: Any) -> torch.Tensor:
            with run.precision.autocast(run.device):
                return loss_fn(run.model, batch)

        wrapped_forward: Forward = fold(hooks, "wrap_forward", forward)

        def step(batch: Any) -> tuple[torch.Tensor, bool]:
            if self.on_xla:  # inside every wrapper: a compiled region's own step marker comes before
                _set_device_seed(run.device, step_seed(self.seed, self.steps))
            window = self._detach_window()
            try:
                loss = check_loss(wrapped_forward(batch), loss_fn)
                scaler = run.scaler
                (scaler.scale(loss) if scaler is not None else loss).backward()
            except BaseException as error:
                self._restore_window(window)
                if isinstance(error, RuntimeError) and "device_ready_queues_" in str(error):
                    raise engine_started_first() from error
                raise
            self._join_window(window)
            self.window += 1
            due = [hook.update_due(self.window) for hook in hooks]  # every practice hears of it
            if all(due):
                self.update()
            return loss.detach(), all(due)

        return fold(hooks, "wrap_step", step)

    # -- the window ---------------------------------------------------------------------------
    def params(self) -> list[torch.Tensor]:
        optimizer = self.run.optimizer
        return [] if optimizer is None else [p for g in optimizer.param_groups for p in g["params"]]

    def _detach_window(self) -> list[torch.Tensor | None] | None:
        """The open window's gradients, taken off the parameters so that backward writes new ones.

        Autograd adds a new gradient into ``.grad`` in place; a step that then
        fails would leave the window with part of a micro-batch in it.
        """
        if not self.window:
            return None
        params = self.params()
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        return grads

    def _join_window(self, window: list[torch.Tensor | None] | None) -> None:
        if window is None:
            return
        for p, old in zip(self.params(), window):
            if old is not None:
                p.grad = old if p.grad is None else old + p.grad

    def _restore_window(self, window: list[torch.Tensor | None] | None) -> None:
        if window is None:
            self.run.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]  # checked at the step's start
            return
        for p, old in zip(self.params(), window):
            p.grad = old

    # -- the update ---------------------------------------------------------------------------
    def update(self) -> None:
        """Apply the window: the one path of every update (see the module docstring)."""
        run = self.run
        optimizer = run.optimizer
        assert optimizer is not None
        self._divisor, self.window = self._divisor_of(self.window), 0
        if self._apply is None:
            self._apply = fold(self.hooks, "wrap_apply", self._apply_window)
        with held_interrupts():
            try:
                self._apply()
                optimizer.zero_grad(set_to_none=True)
                if self._scheduler_steps:
                    run.scheduler.step()
                for hook in self.hooks:
                    hook.after_update()
            except BaseException as error:
                self.broken = (
                    f"an update (after {self.steps} completed steps) failed part-way ({type(error).__name__}: "
                    f"{error}): the weights and the optimizer's state may be partly updated, so this run "
                    "cannot train on. Leave the session and resume from your last checkpoint."
                )
                raise
        self.updates += 1

    def _apply_window(self) -> None:
        optimizer, scaler = self.run.optimizer, self.run.scaler
        assert optimizer is not None
        if self.replicas > 1:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)  # across replicas
        if self._divisor != 1:
            scale = self._scale(self._divisor)
            for p in self.params():
                if p.grad is not None:
                    p.grad.mul_(scale)
        if scaler is not None:
            scaler.unscale_(optimizer)
        for hook in self.hooks:
            hook.on_gradients()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def _divisor_of(self, window: int) -> int:
        """What a window of ``window`` micro-batches is divided by: its length, unless a practice says."""
        for hook in self.hooks:
            divisor = hook.window_divisor(window)
            if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
                raise ValueError(
                    f"{type(hook).__name__}.window_divisor({window}) returned {divisor!r}; it must return "
                    "a positive int (what the window's summed gradients are divided by)"
                )
            if divisor != window:
                return divisor
        return window

    def _scale(self, divisor: int) -> torch.Tensor:
        """``1 / divisor`` as a device tensor: data of the update, so a compiled update never bakes it in."""
        if divisor not in self._scales:
            self._scales[divisor] = torch.tensor(1.0 / divisor, device=self.run.device)
        return self._scales[divisor]

    def end_epoch(self) -> None:
        """An epoch of training ended: apply a window left open, tell the practices, end the step."""
        self.check_can_train()
        if self.window:
            self.update()
            self.updated = True  # run.updated: the last thing trained (a step, this end) updated
        self.epoch += 1
        for hook in self.hooks:
            hook.end_epoch()
        if self.on_xla:
            self.mark()
        for hook in self.hooks:
            hook.between_steps()

    def warn_if_window_open(self) -> None:
        """The session ends: say so when micro-batches' gradients were never applied."""
        if self.window:
            warnings.warn(
                f"the session ended with {self.window} micro-batch(es) whose gradients no update applied "
                "(accumulate_grad). Call run.end_epoch() after a loop you cut short or fed yourself "
                "(run.batches(name) does it when its loader runs out), which applies them.",
                PendingGradientsWarning,
                stacklevel=5,
            )

    # -- the step marker ------------------------------------------------------------------------
    def mark(self) -> None:
        """Issue a step marker: XLA compiles (once) and runs what was traced since the last one."""
        import torch_xla

        torch_xla.sync()
        self.markers += 1

    # -- what a checkpoint carries --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counts and the open window (its gradients on the CPU side of the caller's transfer)."""
        grads = [p.grad for p in self.params()] if self.window else []
        return {
            "steps": self.steps,
            "updates": self.updates,
            "epoch": self.epoch,
            "window": self.window,
            "grads": grads,
            "seed": self.seed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        params = self.params()
        grads = list(state.get("grads", []))
        if state["window"] and len(grads) != len(params):
            raise ValueError(
                f"the checkpoint's open window holds {len(grads)} gradients and this run's optimizer "
                f"has {len(params)} parameters"
            )
        for i, p in enumerate(params):
            g = grads[i] if state["window"] else None
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        self.seed = int(state.get("seed", self.seed))
        self.epoch, self.window = int(state.get("epoch", 0)), int(state["window"])


def step_seed(seed: int, step: int) -> int:
    """The XLA seed of step ``step`` of a run whose stream is ``seed`` (SplitMix64 of their sum).

    Seeding each step from its index alone makes its random numbers (dropout)
    the same however the steps were cut into graphs (a device loader's
    ``batches_per_execution``, a compiled region's own step markers, a capture
    by dynamo) and wherever the run was resumed from a checkpoint.
    """
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def _device_seed(device: torch.device) -> int:
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state(str(device)))


def _set_device_seed(device: torch.device, seed: int) -> None:
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(seed, str(device))


def _steps_itself(scheduler: Any) -> bool:
    """Whether the run steps ``scheduler`` after each update (one whose ``step`` needs a metric,
    such as ``ReduceLROnPlateau``, is stepped by the user: ``run.scheduler.step(val_loss)``)."""
    if scheduler is None:
        return False
    try:
        params = inspect.signature(scheduler.step).parameters.values()
    except (TypeError, ValueError):
        return True
    return not any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    )


def fold(hooks: tuple[Hook, ...], wrap: str, fn: Callable) -> Callable:
    """``fn`` wrapped by each hook's ``wrap`` method, the first hook outermost; each checked to call
    what it wraps."""
    for hook in reversed(hooks):
        if getattr(type(hook), wrap) is getattr(Hook, wrap):
            continue  # the default passes fn through
        fn = _checked(hook, wrap, fn)
    return fn


class _Called:
    """Set by a wrapped function when it runs: written, never read, inside it (a function
    torch.compile captures replays the write and keeps no guard on it)."""

    __slots__ = ("called",)

    def __init__(self) -> None:
        self.called = False


def _checked(hook: Hook, wrap: str, inner: Callable) -> Callable:
    seen = _Called()

    def counted(*args: Any) -> Any:
        seen.called = True
        return inner(*args)

    outer = getattr(hook, wrap)(counted)
    if not callable(outer):
        raise TypeError(f"{type(hook).__name__}.{wrap} returned a {type(outer).__name__}, not a function")

    def checked(*args: Any) -> Any:
        seen.called = False
        result = outer(*args)
        if not seen.called:
            raise WrapperError(
                f"{type(hook).__name__}.{wrap} returned a function that did not call the function it "
                "wraps: the practices inside it (and the step itself) were skipped. A wrapper must call "
                "what it wraps, once per call."
            )
        return result

    return checked


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Ctrl-C (SIGINT) held until the block ends, then raised (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(*caught[0])
        else:
            raise KeyboardInterrupt


def check_loss(loss: Any, loss_fn: Callable) -> torch.Tensor:
    """``loss`` if it is a scalar tensor autograd can differentiate; a clear error otherwise."""
    name = getattr(loss_fn, "__qualname__", "loss_fn")
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"{name} returned a {type(loss).__name__}; it must return the loss as a scalar tensor "
            "(e.g. torch.nn.functional.cross_entropy(model(x), y), or model(**batch).loss), not "
            "a Python number or None"
        )
    if loss.numel() != 1:
        raise ValueError(
            f"{name} returned a tensor of shape {tuple(loss.shape)}; the loss must be a scalar: "
            "reduce it (loss.mean() or loss.sum())"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"{name} returned a loss that does not depend on any trainable parameter (requires_grad "
            "is False): the loss was detached (.detach(), .item(), torch.no_grad()) or every "
            "parameter is frozen (requires_grad=False). Compute it from the model's output with "
            "gradients on, and leave at least one parameter trainable."
        )
    return loss


def engine_started_first() -> RuntimeError:
    """The error for a backward pass on XLA (in the step, or inside a scan's forward) that the
    autograd engine cannot run: it started before torch_xla's runtime did."""
    return RuntimeError(
        "PyTorch's autograd engine started (a backward pass ran) before "
        "torch_xla's runtime did, so it has no queue for the XLA device. "
        "Start the runtime before any backward pass in this process (call "
        "torch_xla.device() first, e.g. before training an eager reference), or "
        "run the XLA training in its own process."
    )
