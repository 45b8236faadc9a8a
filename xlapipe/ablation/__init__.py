"""Ablations as a command: which practice buys what, measured in fresh processes, and decided.

>>> from xlapipe.ablation import ablate
>>> results = ablate("examples/nlp_example.py", args=["--size", "small", "--max-steps", "40"], repeats=6)
>>> print(results.table())          # speed-ups with paired intervals and verdicts
>>> print(results.recommendation.python)

See docs/ablation.md for the modes, the statistics, the output files and the workload contract.
"""

from xlapipe.ablation.analysis import Analysis, Summary, TargetMetric, analyse
from xlapipe.ablation.design import Design
from xlapipe.ablation.recommend import Recommendation, recommend
from xlapipe.ablation.report import markdown, plot, plot_phases, table, write_all, write_csv
from xlapipe.ablation.results import Results
from xlapipe.ablation.runner import ablate, parse_duration, schedule
from xlapipe.ablation.stats import (
    Effect,
    EffectFit,
    Interval,
    Stats,
    Verdict,
    fit_effects,
    paired_interval,
    verdict,
)
from xlapipe.ablation.target import Target, resolve_target
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
    "MODES",
    "Analysis",
    "Design",
    "Effect",
    "EffectFit",
    "Interval",
    "Plan",
    "Recommendation",
    "Refused",
    "Results",
    "Stats",
    "Summary",
    "Target",
    "TargetMetric",
    "Variant",
    "Verdict",
    "ablate",
    "add_one",
    "analyse",
    "explicit",
    "factorial",
    "fit_effects",
    "leave_one_out",
    "markdown",
    "paired_interval",
    "parse_duration",
    "plan",
    "plot",
    "plot_phases",
    "recommend",
    "resolve_target",
    "schedule",
    "table",
    "verdict",
    "write_all",
    "write_csv",
]
