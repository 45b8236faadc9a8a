"""What an ablation shows while it runs: a bar with the time left and the rows still undecided.

The time left is the typical run time of each variant (the median of its
runs so far; of all runs for one not run yet) summed over the runs planned,
and, while rounds may still be added, over the most the undecided rows can
still get ("at most"); the budget, when there is one, caps both. Without
tqdm (or with ``progress=False``), one line per run says the same.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class Clock:
    """Typical run times per variant, from the runs recorded so far."""

    def __init__(self, elapsed: Mapping[str, list[float]]) -> None:
        self.elapsed = {name: list(times) for name, times in elapsed.items()}

    def add(self, name: str, seconds: float) -> None:
        self.elapsed.setdefault(name, []).append(seconds)

    def typical(self, name: str) -> float | None:
        mine = self.elapsed.get(name)
        every = [t for times in self.elapsed.values() for t in times]
        return statistics.median(mine) if mine else statistics.median(every) if every else None

    def longest(self, name: str) -> float | None:
        """The longest run of ``name`` so far (of any variant for one not run yet): what a run may take."""
        mine = self.elapsed.get(name)
        every = [t for times in self.elapsed.values() for t in times]
        return max(mine) if mine else max(every) if every else None

    def total(self, names: Iterable[str], longest: bool = False) -> float | None:
        """The typical (or, with ``longest``, the longest) run times of ``names``, summed; None if unknown."""
        times = [self.longest(n) if longest else self.typical(n) for n in names]
        return None if any(t is None for t in times) else sum(t for t in times if t is not None)


def duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``1 h 5 min``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def status(
    left: float | None, most: float | None, undecided: Iterable[str], budget: float | None = None
) -> str:
    """``about 6 min left (at most 14 min); undecided: a, b`` in a few words; the budget caps both."""
    if budget is not None and (left is None or left > budget):
        text = f"about {duration(budget)} left (the budget)"
    else:
        text = f"about {duration(left)} left"
        if most is not None and left is not None and most > left + 30:
            text += f" (at most {duration(min(most, budget) if budget is not None else most)})"
    names = list(undecided)
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        text += f"; undecided: {shown}"
    return text


class Progress:
    """A tqdm bar (or one line per run through ``echo``) for the runs of an ablation."""

    def __init__(self, total: int, done: int, enabled: bool, echo: Callable[[str], None] | None) -> None:
        self.echo = echo
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm comes with the [examples] and [test] extras
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, initial=done, unit="run", desc="ablation", dynamic_ncols=True)
        self.text = ""

    def extend(self, runs: int) -> None:
        """Rounds added: ``runs`` more to run."""
        if self.bar is not None:
            self.bar.total += runs
            self.bar.refresh()

    def starting(self, what: str, state: str) -> None:
        self.text = state
        if self.bar is not None:
            self.bar.set_postfix_str(f"{what}; {state}")

    def finished(self, line: str) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if self.echo:
                self.bar.write(line)
        elif self.echo:
            self.echo(f"{line}; {self.text}" if self.text else line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
