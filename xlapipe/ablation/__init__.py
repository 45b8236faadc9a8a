"""Ablations as a command: which practice buys what, measured in fresh processes.

>>> from xlapipe.ablation import ablate
>>> results = ablate("examples/nlp_example.py", args=["--size", "small", "--max-steps", "40"])
>>> print(results.table())

See docs/ablation.md for the modes, the output files and the workload contract.
"""
from xlapipe.ablation.report import markdown, plot, table, write_all, write_csv
from xlapipe.ablation.results import Results, Stats, Summary
from xlapipe.ablation.runner import Target, ablate, resolve_target, schedule
from xlapipe.ablation.variants import (
    MODES,
    Plan,
    Refused,
    Variant,
    add_one,
    explicit,
    factorial,
    leave_one_out,
    plan,
)

__all__ = [
    "MODES", "Plan", "Refused", "Results", "Stats", "Summary", "Target", "Variant", "ablate",
    "add_one", "explicit", "factorial", "leave_one_out", "markdown", "plan", "plot",
    "resolve_target", "schedule", "table", "write_all", "write_csv",
]
