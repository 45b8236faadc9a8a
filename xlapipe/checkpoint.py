"""Checkpoints of a :class:`~xlapipe.session.Run` that survive faults and refuse to resume wrong.

>>> with xp.session(setup) as run:
...     step = checkpoint.restore(path, run) if os.path.exists(path) else 0
...     ...
...     checkpoint.save(path, run, step=step)

A checkpoint (format ``xlapipe-checkpoint/3``) holds the model, the optimizer
and its class, the gradient scaler (fp16), the scheduler and its class (the
run's own, ``TrainingSetup(scheduler=...)``, or one passed as ``scheduler=``),
the step, the run's counts (steps, updates, ``run.epoch``) and its open
window of accumulated gradients (a save between micro-batches resumes the
window exactly), every random number generator a run draws from (Python's
``random``, NumPy's global one when installed, torch's CPU generator, and
the XLA device's), the state of each practice that keeps one
(``Hook.state_dict``: an average of weights, a profile window), each loader's
position and random state (:mod:`xlapipe.loader_position`), ``extra``, and a
SHA-256 digest of each of these parts.

Where in the data a resumed run starts: at the next batch of the same order,
inside an epoch or at its boundary, shuffled loaders, ``wrap_loader_mp`` and
``static_shapes`` included, with no skipping written by the user. Iterate
``run.batches(name)`` (``for epoch in range(run.epoch, epochs)``): the first
loop continues the epoch the checkpoint was saved in, replaying its batches
from the generators of its start where the dataset, collate function or
workers may draw (a sampler shuffling with ``random``, augmentation): the
data is the uninterrupted run's, bit for bit. A save inside an epoch of a
loader whose position xlapipe cannot know (an iterable that is neither a
DataLoader, a list, nor a loader with ``state_dict``) is refused, and so is a
restore into a loader other than the saving run's (batch size, sampler,
dataset length, ``drop_last``, a list for a DataLoader), naming the field.
After a restore the user's own optimizer (the one given to the setup) holds
the restored hyperparameters too. Random
numbers (dropout) resume exactly too: each step's XLA generator is seeded from
the run's stream and the step's index (kept in the checkpoint), so a resumed
step draws what the uninterrupted one drew however steps were cut into graphs
(``batches_per_execution``, ``compile_step(backend="torch_xla")``). Where
torch_xla 2.9 cannot repeat them (dropout compiled by ``compile_step``'s
``openxla`` backend, or inside ``scan_layers``), the save is refused with the
reason. Not saved:
the random state of worker processes kept across epochs
(``persistent_workers=True``; ``save`` warns).

``restore`` returns the step given to ``save`` and sets ``run.steps``,
``run.updates`` and ``run.epoch``. To build the model from values saved in
``extra`` (nanoGPT saves its ``model_args``), read the file first:
``checkpoint.load(path)["extra"]``, then build the setup and restore.

Saving never replaces a good checkpoint with a bad one. Before anything is
written, the whole state (``extra`` first) is checked for values weights-only
loading cannot read back, and refused with the conversion to make. The state
is moved to the CPU, written to a temporary file in the same folder, flushed
to disk (``fsync``), read back (``weights_only=True``) and checked whole, and
only then renamed over the old checkpoint (``os.replace``). A
process killed while saving leaves the previous checkpoint whole and a
``.<name>.xlapipe-<host>-<pid>-<random>.tmp`` file, which the next save in that
folder removes once that process is gone (never a live writer's, nor another
host's). Saving ends the pending step but leaves the run's random stream as
it was. Only the main replica (global ordinal 0) writes; every replica takes
part in the transfer, as ``torch_xla.core.xla_model.save`` does.

Reading is checked too. :func:`load` refuses a file that is not whole, one
whose parts do not match their digest (a flipped byte in a tensor), and the
earlier format 1. :func:`restore` checks that everything fits the run (model
keys and shapes, optimizer class and parameter groups, scheduler class,
scaler, loaders) before it changes anything.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from xlapipe.checkpoint_file import check_loadable, digest, remove_stale_temporaries, write_atomic
from xlapipe.host_rng import host_rng_state, set_host_rng_state
from xlapipe.run import Run

__all__ = [
    "FORMAT",
    "load",
    "remove_stale_temporaries",
    "restore",
    "rng_state",
    "save",
    "set_rng_state",
    "write_atomic",
]

FORMAT = "xlapipe-checkpoint/3"
_EARLIER = ("xlapipe-checkpoint/1", "xlapipe-checkpoint/2")
PARTS = (
    "step",
    "run",
    "model",
    "optimizer",
    "optimizer_class",
    "scaler",
    "scheduler",
    "scheduler_class",
    "rng",
    "loaders",
    "practices",
    "extra",
)  # each has a digest
KEYS = ("format", "digest", *PARTS)


# -- what is saved -----------------------------------------------------------------


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator a run draws from, as plain data and CPU tensors."""
    state = host_rng_state()
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        state["xla"] = int(xm.get_rng_state(str(device)))  # torch_xla takes the name, str(device)
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Put back what :func:`rng_state` took (generators it did not save are left alone)."""
    set_host_rng_state(state)
    if "xla" in state and device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(state["xla"], str(device))


# torch_xla's step marker moves the device's RNG seed on: seed = ADD + MUL * seed
# (mod 2**64; DeviceContextArena::MarkStep in torch_xla 2.9). Its inverse lets a
# save end the pending step without changing the random stream of the run.
_MARK_STEP_ADD, _MARK_STEP_MUL = 1012031, 7012063
_MARK_STEP_MUL_INVERSE = pow(_MARK_STEP_MUL, -1, 2**64)


def _end_pending_step(device: torch.device) -> None:
    """Execute the pending graph, leaving the XLA seed where the next step marker expects it.

    Between two steps ``xm.get_rng_state`` is the *running* seed (moved on by
    every random op traced since the last step marker), not the seed the next
    marker starts from. A sync makes them equal, at the cost of one marker; the
    seed is then set back by that marker, so the run that saves draws the same
    numbers as one that does not, and a run restored from the file draws them too.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    marked = int(xm.get_rng_state(str(device)))
    xm.set_rng_state(((marked - _MARK_STEP_ADD) * _MARK_STEP_MUL_INVERSE) % 2**64, str(device))


def _scheduler(run: Run, scheduler: Any) -> Any:
    """The run's own scheduler, or the one the caller keeps (not both)."""
    if scheduler is not None and run.scheduler is not None and scheduler is not run.scheduler:
        raise ValueError(
            "this run has its own scheduler (TrainingSetup(scheduler=...)), which checkpoints save "
            "and restore; do not pass another one as scheduler=..."
        )
    return run.scheduler if scheduler is None else scheduler


def _class_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def window_rule(run: Run) -> list[list[Any]]:
    """The practices that decide when a window of micro-batches is applied and what it is divided by
    (``Hook.update_due``, ``Hook.window_divisor``), as ``[name, params]``: an open window resumes
    exactly only under the same ones."""
    from xlapipe.hooks import Hook

    def decides(hook: Hook) -> bool:
        kind = type(hook)
        return kind.update_due is not Hook.update_due or kind.window_divisor is not Hook.window_divisor

    return [[t.name, dict(t.params)] for t in run.setup.applied if any(decides(h) for h in t.hooks)]


def _state(run: Run, step: int, scheduler: Any, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "step": step,
        "run": {**run.stepper.state_dict(), "window_rule": window_rule(run)},
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict() if run.optimizer is not None else None,
        "optimizer_class": _class_name(run.optimizer),
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scheduler_class": _class_name(scheduler),
        "rng": rng_state(run.device),
        "loaders": {name: loader.state_dict() for name, loader in run.positions.items()},
        "practices": run.practice_states(),
        "extra": extra,
    }


# -- who writes, and how -------------------------------------------------------------


def _replicas(run: Run) -> tuple[bool, int]:
    """(is this the main replica, how many replicas take part)."""
    if run.device.type != "xla":
        return True, 1
    import torch_xla.runtime as xr

    return xr.global_ordinal() == 0, xr.world_size()


def save(
    path: str | os.PathLike,
    run: Run,
    *,
    step: int,
    scheduler: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> bool:
    """Save ``run`` at ``step`` (and ``scheduler``, and ``extra``); see the module docstring.

    ``extra`` is plain data that weights-only loading reads back: None, bools,
    numbers, strings, bytes, lists, tuples, dicts, sets, tensors, dtypes and
    devices. Anything else (a NumPy scalar or array, a ``datetime``, a
    ``pathlib.Path``, an ``argparse.Namespace``) is refused with the
    conversion to make (``x.item()``, ``str(path)``, ``vars(args)``...):
    nothing is converted for you, and nothing is written.

    Call it on every replica: all take part in the transfer to the host, the
    main replica writes. Returns True in the replica that wrote.
    """
    if not isinstance(run, Run):
        raise TypeError(f"save takes the Run that xlapipe.session(...) yields, got {type(run).__name__}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"save: step must be a non-negative int, got {step!r}")
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"save: extra must be a dict of plain data, got {type(extra).__name__}")
    extra = dict(extra or {})
    check_loadable(extra, "extra")
    scheduler = _scheduler(run, scheduler)
    run.follow_user_optimizer()  # a rate set on the user's optimizer since the last step is saved too
    for hook in run.hooks:
        hook.before_save()
    for loader in run.positions.values():
        problem = loader.why_not_resumable()
        if problem is not None:
            raise ValueError(f"checkpoint.save inside an epoch: {problem}. Nothing was written")
        loader.warn_if_not_restorable()
    main, replicas = _replicas(run)
    with _checkpointing(run):
        if run.device.type == "xla":
            _end_pending_step(run.device)
        state = _state(run, step, scheduler, extra)
        for part in PARTS:  # e.g. a scheduler of the user's whose state holds a NumPy float
            check_loadable(state[part], part)
        if run.device.type == "xla":
            import torch_xla.core.xla_model as xm

            state = xm._maybe_convert_to_cpu(state, convert=main)  # type: ignore[assignment]  # annotated as the arena; returns the converted data
    if main:
        state["digest"] = {part: digest(state[part], part) for part in PARTS}
        write_atomic(state, path, check=lambda written: _check_written(written, path))
    if replicas > 1:
        import torch_xla.core.xla_model as xm

        xm.rendezvous("xlapipe.checkpoint.save")  # nobody reads it before it is whole
    return main


@contextlib.contextmanager
def _checkpointing(run: Run) -> Iterator[None]:
    """Each practice's ``checkpointing`` context (e.g. ema puts the model's own weights back)."""
    with contextlib.ExitStack() as stack:
        for hook in run.hooks:
            stack.enter_context(hook.checkpointing())
        yield


def _check_written(written: str, path: str | os.PathLike) -> None:
    """The temporary file reads back (weights-only) with every part and its digest record.

    It is mapped, not read (``mmap=True``), and not hashed again: its bytes
    would come back from the page cache, not the disk, so a second pass over
    the state would catch only a fault of ``torch.save`` itself.
    """
    try:
        _verified(
            torch.load(written, map_location="cpu", weights_only=True, mmap=True), written, hashed=False
        )
    except Exception as error:
        raise RuntimeError(
            f"checkpoint.save: the file written for {os.fspath(path)!r} does not read back ({error}); "
            "it was removed and the previous checkpoint is kept"
        ) from error


# -- reading -------------------------------------------------------------------------------


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path`` as CPU tensors and plain data (``extra`` included), checked whole."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {os.fspath(path)!r}")
    if os.path.getsize(path) == 0:
        raise ValueError(
            f"{os.fspath(path)!r} is empty (0 bytes), not an xlapipe checkpoint: a save into it never "
            "finished, or something else created it. Resume from an earlier checkpoint"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"{os.fspath(path)!r} is not a readable xlapipe checkpoint: {error}. If it is one, it is "
            "cut short or damaged: resume from an earlier checkpoint"
        ) from error
    return _verified(state, path)


def _verified(state: Any, path: str | os.PathLike, hashed: bool = True) -> dict[str, Any]:
    """``state`` if it is a whole checkpoint of this format (whose parts match their digests)."""
    where = repr(os.fspath(path))
    written = state.get("format") if isinstance(state, dict) else None
    if not isinstance(written, str) or not written.startswith("xlapipe-checkpoint/"):
        raise ValueError(
            f"{where} is not an xlapipe checkpoint (expected format {FORMAT!r}); "
            "write checkpoints with xlapipe.checkpoint.save"
        )
    if written in _EARLIER:
        raise ValueError(
            f"{where} was written by an earlier xlapipe (format {written!r}), which stored no loader "
            f"position, practice state or open accumulation window; this xlapipe reads {FORMAT!r} only "
            "and cannot resume it exactly. Resume with the xlapipe that wrote it, or take its weights: "
            "run.model.load_state_dict(torch.load(path, weights_only=True)['model']), then save anew"
        )
    if written != FORMAT:
        raise ValueError(
            f"{where} has format {written!r}, from another version of xlapipe; this one "
            f"reads {FORMAT!r}: use the xlapipe that wrote it"
        )
    missing = [key for key in KEYS if key not in state]
    if missing:
        raise ValueError(
            f"{where} is not a whole xlapipe checkpoint: it lacks {', '.join(missing)} (it holds "
            f"{', '.join(map(str, state))}). Resume from a checkpoint written by xlapipe.checkpoint.save"
        )
    digests = state["digest"]
    if not isinstance(digests, dict) or set(digests) != set(PARTS):
        raise ValueError(
            f"{where} is damaged: its digest record is not whole. Resume from an earlier "
            "checkpoint, or copy this one again from where it was written"
        )
    damaged = [part for part in PARTS if hashed and digest(state[part], part) != digests[part]]
    if damaged:
        raise ValueError(
            f"{where} is damaged: its {', '.join(damaged)} "
            + (
                "parts do not match the digest written with them "
                if len(damaged) > 1
                else "part does not match the digest written with it "
            )
            + "(bytes changed on disk or in a copy). Do not "
            "resume from it: use an earlier checkpoint, or copy this one again from where it was written"
        )
    verified: dict[str, Any] = state  # a dict: checked above
    return verified


# -- restoring -------------------------------------------------------------------------------


def _match(name: str, saved: Any, present: bool, how: str) -> None:
    if (saved is not None) != present:
        raise ValueError(
            f"restore: the checkpoint {'holds' if saved is not None else 'has no'} {name} state "
            f"and this run {'has' if present else 'has no'} {name}; {how}"
        )


def _same_class(name: str, saved: str | None, obj: Any, how: str) -> None:
    mine = _class_name(obj)
    if saved is not None and mine is not None and saved != mine:
        raise ValueError(
            f"restore: the checkpoint holds the state of a {saved} {name} and this run's "
            f"{name} is a {mine}; {how}. Nothing was changed"
        )


def _check_model(saved: Mapping[str, Any], model: torch.nn.Module) -> None:
    mine = model.state_dict()
    missing, unexpected = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    shapes = [
        f"{key}: {tuple(saved[key].shape)} saved, {tuple(value.shape)} here"
        for key, value in mine.items()
        if key in saved
        and isinstance(value, torch.Tensor)
        and isinstance(saved[key], torch.Tensor)
        and saved[key].shape != value.shape
    ]
    if missing or unexpected or shapes:
        found = "; ".join(
            f"{what}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
            for what, keys in (
                ("not in the checkpoint", missing),
                ("not in this model", unexpected),
                ("other shapes", shapes),
            )
            if keys
        )
        raise ValueError(
            f"restore: the checkpoint's model does not fit this run's model ({found}). Nothing "
            "was changed; build the model as the saving run did (the same architecture and sizes)"
        )


def _check_optimizer(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> None:
    sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
    mine = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != mine:
        raise ValueError(
            f"restore: the checkpoint's optimizer has parameter groups of {sizes} parameters and this "
            f"run's has {mine}. Nothing was changed; build the optimizer with the parameter groups of "
            "the saving run"
        )


def _check_fits(state: Mapping[str, Any], run: Run, scheduler: Any) -> None:
    """Everything :func:`restore` will put into ``run`` fits it; raise before anything changes."""
    _match(
        "optimizer",
        state["optimizer"],
        run.optimizer is not None,
        "build the setup with the same optimizer as the run that saved it",
    )
    _match(
        "scheduler",
        state["scheduler"],
        scheduler is not None,
        "pass scheduler=... exactly when the saving run did",
    )
    _match(
        "gradient scaler",
        state["scaler"],
        run.scaler is not None,
        "restore with the precision the run was saved with (fp16 uses a scaler)",
    )
    _same_class(
        "optimizer",
        state["optimizer_class"],
        run.optimizer,
        "build the setup with the optimizer the saving run had, or take only the weights: "
        "run.model.load_state_dict(checkpoint.load(path)['model'])",
    )
    _same_class(
        "scheduler", state["scheduler_class"], scheduler, "build the run's scheduler as the saving run did"
    )
    _check_model(state["model"], run.model)
    if run.optimizer is not None:
        _check_optimizer(state["optimizer"], run.optimizer)
    saved, mine = set(state["loaders"]), set(run.positions)
    if saved != mine:
        raise ValueError(
            f"restore: the checkpoint holds loaders {sorted(saved)} and this run has {sorted(mine)}. "
            "Nothing was changed; build the setup with the loaders of the saving run (the same names)"
        )
    for name, loader in run.positions.items():
        problem = loader.mismatch(state["loaders"][name])
        if problem is not None:
            raise ValueError(f"restore: {problem}. Nothing was changed")
    problem = run.practices_mismatch(state["practices"])
    if problem is not None:
        raise ValueError(f"restore: {problem}. Nothing was changed")
    window = state["run"].get("window", 0)
    if window and run.optimizer is not None and len(state["run"]["grads"]) != len(run.stepper.params()):
        raise ValueError(
            f"restore: the checkpoint's open window holds {len(state['run']['grads'])} gradients and "
            f"this run's optimizer has {len(run.stepper.params())} parameters. Nothing was changed"
        )
    saved_rule, rule = state["run"].get("window_rule"), window_rule(run)
    if window and saved_rule is not None and saved_rule != rule:
        raise ValueError(
            f"restore: the checkpoint was saved inside an accumulation window ({window} micro-batches "
            f"of it pending) under {_rule_text(saved_rule)}, and this run applies windows under "
            f"{_rule_text(rule)}: the pending micro-batches would be applied on another schedule. Nothing was "
            "changed; restore into the pipeline that saved it, or save where no window is open "
            "(run.window == 0, e.g. when run.updated)"
        )


def _rule_text(rule: list[list[Any]]) -> str:
    said = (f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})" for name, params in rule)
    return ", ".join(said) or "none (an update every micro-batch)"


def restore(path: str | os.PathLike, run: Run, *, scheduler: Any = None) -> int:
    """Load the checkpoint at ``path`` into ``run`` (and ``scheduler``); return its step.

    Call it on every replica, right after the session starts and before the
    first step. Everything is checked against the run first; a checkpoint that
    does not fit is refused with the run unchanged. The model's parameters keep
    their identity (and sharding), so the run's optimizer stays bound to them.
    ``run.steps``, ``run.updates`` and ``run.epoch`` are the saving run's, and
    the next ``run.batches(name)`` loop continues where it stood.
    """
    if not isinstance(run, Run):
        raise TypeError(f"restore takes the Run that xlapipe.session(...) yields, got {type(run).__name__}")
    scheduler = _scheduler(run, scheduler)
    state = load(path)
    _check_fits(state, run, scheduler)
    try:
        with _checkpointing(run):
            _put_back(state, run, scheduler)
    except Exception as error:
        raise RuntimeError(
            f"restore: putting {os.fspath(path)!r} into the run failed part-way ({type(error).__name__}: "
            f"{error}); the run is partly restored and must not train on. Leave this session and start a "
            "new one"
        ) from error
    run.restored()
    return int(state["step"])


def _put_back(state: Mapping[str, Any], run: Run, scheduler: Any) -> None:
    """Put ``state`` (checked to fit) into ``run`` and ``scheduler``."""
    run.model.load_state_dict(state["model"])
    if run.optimizer is not None:
        run.optimizer.load_state_dict(state["optimizer"])
    if run.scaler is not None:
        run.scaler.load_state_dict(state["scaler"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"], run.device)
    for name, loader in run.positions.items():
        loader.load_state_dict(state["loaders"][name])
    run.stepper.load_state_dict(state["run"])
    run.load_practice_states(state["practices"])
