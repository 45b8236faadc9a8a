"""A user's own practice, registered on import: switched on from the command line with --import."""

from __future__ import annotations

from attrs import frozen

import xlapipe as xp


@frozen
class CountSteps(xp.Hook):
    """Counts the steps of each run (a practice with per-run state would keep it in start's object)."""

    label: str

    def after_step(self, batch, loss, updated) -> None:
        print(f"{self.label}: a step")


@xp.register
def count_steps(label: str = "steps") -> xp.Transform:
    return xp.Transform("count_steps", params={"label": label}, hooks=(CountSteps(label),))
