"""The user's own optimizer, followed: hyperparameters set on it during a session reach the run.

A session trains a copy of the optimizer given to :class:`xlapipe.TrainingSetup`.
Scripts often set the learning rate by hand on the optimizer they built
(``for g in optimizer.param_groups: g["lr"] = get_lr(it)``, nanoGPT), or step
a ``ReduceLROnPlateau`` built on it. Before each step the run compares the
user's parameter groups with what it saw last and copies what changed (every
key but ``params``) into its own optimizer, so those changes take effect. A
change the run cannot honour is refused with the fix: a learning rate set on
the user's optimizer while the run's scheduler sets it, a value set on both
optimizers to different values, parameter groups added or removed, or a
scheduler built on the user's optimizer inside the session.

The comparison is with copies of the values (a tensor's is a clone), so a
tensor rate changed in place (``g["lr"].fill_(0.05)``, as torch's schedulers
change one) is followed like a rate set anew. After
:func:`xlapipe.checkpoint.restore`, the user's optimizer holds the restored
values (as if the checkpoint had been loaded into it), so a rate changed
relative to itself (``g["lr"] *= 0.5``) goes on from the saved rate.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

_NOT_HYPERPARAMETERS = ("params", "param_names")


def _copy(value: Any) -> Any:
    """A copy that an in-place change of ``value`` does not reach (``copy.copy`` of a tensor shares
    its storage)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - a value that cannot be copied deeply is compared as it is
        return copy.copy(value)


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [
        {k: _copy(v) for k, v in g.items() if k not in _NOT_HYPERPARAMETERS} for g in optimizer.param_groups
    ]


def _put(group: dict[str, Any], key: str, value: Any) -> None:
    """Set ``group[key]`` to ``value``; a tensor there is changed in place (others may hold it)."""
    held = group.get(key)
    if isinstance(held, torch.Tensor) and isinstance(value, torch.Tensor) and held.shape == value.shape:
        with torch.no_grad():
            held.copy_(value)
    elif isinstance(held, torch.Tensor) and held.numel() == 1 and isinstance(value, (int, float)):
        with torch.no_grad():
            held.fill_(value)
    else:
        group[key] = _copy(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a is b or (a.shape == b.shape and torch.equal(a.detach().cpu(), b.detach().cpu())))
        )
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are different
        return a is b


class Follower:
    """Copies the hyperparameters the user changes on ``user`` into ``run_optimizer``."""

    def __init__(self, user: torch.optim.Optimizer, run_optimizer: torch.optim.Optimizer, scheduled: bool):
        self.user, self.run_optimizer, self.scheduled = user, run_optimizer, scheduled
        self.user_seen = _hyperparameters(user)
        self.run_seen = _hyperparameters(run_optimizer)

    def sync(self) -> None:
        """Take the user's changes since the last call into the run's optimizer (or refuse them)."""
        now = _hyperparameters(self.user)
        if len(now) == len(self.user_seen) and all(
            set(a) == set(b) and all(_same(a[k], b[k]) for k in a) for a, b in zip(now, self.user_seen)
        ):
            return
        if len(now) == len(self.user_seen) and all(
            set(a) - set(b) == {"initial_lr"} and set(b) <= set(a) for a, b in zip(now, self.user_seen)
        ):
            found = _schedulers_of(self.user)
            name = found[0] if found else "StepLR"
            built = (
                f"a learning-rate scheduler ({', '.join(found)})" if found else "a learning-rate scheduler"
            )
            raise ValueError(
                f"{built} was built on your optimizer during the session (its parameter groups gained "
                "'initial_lr'): it would change the rate of your optimizer, and the run trains a copy "
                "built when the session started. Give the scheduler to the setup, "
                f"TrainingSetup(..., scheduler=lambda opt: {name}(opt, ...)) (the run steps it after "
                f"each update and checkpoints save it), or build it on the run's optimizer: "
                f"{name}(run.optimizer, ...)"
            )
        if len(now) != len(self.user_seen) or any(set(a) != set(b) for a, b in zip(now, self.user_seen)):
            raise ValueError(
                "your optimizer's parameter groups (or their keys) changed during the session; the run "
                "trains a copy built when the session started and cannot follow that. Build the "
                "optimizer with all its groups before the session, or change the run's: run.optimizer"
            )
        groups = self.run_optimizer.param_groups
        for i, (old, new) in enumerate(zip(self.user_seen, now)):
            for key in new:
                if _same(old[key], new[key]):
                    continue
                if key == "lr" and self.scheduled:
                    raise ValueError(
                        f"the learning rate of group {i} was set on your optimizer during the session "
                        f"({old[key]!r} -> {new[key]!r}), and this run's learning rate is set by its scheduler "
                        "(TrainingSetup(scheduler=...)), which would overwrite it at the next update. Set "
                        "it in one place: drop the scheduler, or let it alone set the rate"
                    )
                theirs = groups[i].get(key)
                if not _same(theirs, self.run_seen[i].get(key)) and not _same(theirs, new[key]):
                    raise ValueError(
                        f"{key} of group {i} was set both on your optimizer ({new[key]!r}) and on the run's "
                        f"(run.optimizer: {theirs!r}) during the session. Set it on one of them (the run "
                        "trains with run.optimizer; changes to yours are copied into it at the next step)"
                    )
                _put(groups[i], key, new[key])
        self.user_seen = now
        self.run_seen = _hyperparameters(self.run_optimizer)

    def restored(self) -> None:
        """A checkpoint was put into the run: the user's optimizer takes its values too, as if the
        checkpoint had been loaded into it (a rate changed relative to itself goes on from there)."""
        for mine, theirs in zip(self.user.param_groups, self.run_optimizer.param_groups):
            for key, value in theirs.items():
                if key not in _NOT_HYPERPARAMETERS:
                    _put(mine, key, value)
        self.user_seen = _hyperparameters(self.user)
        self.run_seen = _hyperparameters(self.run_optimizer)

    def seen_by_run(self) -> None:
        """The run's own optimizer changed legitimately (its scheduler stepped, a restore)."""
        self.run_seen = _hyperparameters(self.run_optimizer)


def _schedulers_of(optimizer: torch.optim.Optimizer) -> list[str]:
    """The classes of the schedulers built on ``optimizer`` that are still alive (for a message)."""
    import gc

    kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    holders = gc.get_referrers(optimizer)  # a scheduler, or its __dict__ (then the scheduler refers to that)
    found = {type(h).__name__ for h in holders if isinstance(h, kinds) and h.optimizer is optimizer}
    for held in (h for h in holders if isinstance(h, dict) and h.get("optimizer") is optimizer):
        found |= {type(o).__name__ for o in gc.get_referrers(held) if isinstance(o, kinds)}
    return sorted(found)
