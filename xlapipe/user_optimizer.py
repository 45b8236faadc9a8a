"""The user's own optimizer, followed: hyperparameters set on it during a session reach the run.

A session trains a copy of the optimizer given to :class:`xlapipe.TrainingSetup`.
Scripts often set the learning rate by hand on the optimizer they built
(``for g in optimizer.param_groups: g["lr"] = get_lr(it)``, nanoGPT), or step
a ``ReduceLROnPlateau`` built on it. Before each step the run compares the
user's parameter groups with what it saw last and copies what changed (every
key but ``params``) into its own optimizer, so those changes take effect. A
change the run cannot honour is refused with the fix: a learning rate set on
the user's optimizer while the run's scheduler sets it, a value set on both
optimizers to different values, or parameter groups added or removed.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

_NOT_HYPERPARAMETERS = ("params", "param_names")


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [
        {k: copy.copy(v) for k, v in g.items() if k not in _NOT_HYPERPARAMETERS}
        for g in optimizer.param_groups
    ]


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
                groups[i][key] = copy.copy(new[key])
        self.user_seen = now
        self.run_seen = _hyperparameters(self.run_optimizer)

    def seen_by_run(self) -> None:
        """The run's own optimizer changed legitimately (its scheduler stepped, a restore)."""
        self.run_seen = _hyperparameters(self.run_optimizer)
