"""Ablations as a command: which practice buys what, measured in fresh processes, and decided.

>>> from xlapipe.ablation import Judging, Variants, ablate
>>> results = ablate("train.py", ["--epochs", "1"], variants=Variants(mode="add-one"), output="results/abl")
>>> print(results.table())          # speed-ups with paired intervals and verdicts
>>> print(results.recommendation.python)

The script runs unchanged: each variant replaces the pipeline it trains with,
and the session measures it. See docs/ablation.md for the modes, the
statistics, the output files and the workload contract.
"""

from xlapipe.ablation.analysis import Analysis, Summary, analyse
from xlapipe.ablation.design import Design
from xlapipe.ablation.options import Judging, Output, Runs, TargetMetric, Variants, parse_duration
from xlapipe.ablation.recommend import Recommendation, recommend
from xlapipe.ablation.report import markdown, plot, plot_phases, table, write_all, write_csv
from xlapipe.ablation.results import Results
from xlapipe.ablation.runner import ablate, schedule
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
    "Judging",
    "Output",
    "Plan",
    "Recommendation",
    "Refused",
    "Results",
    "Runs",
    "Stats",
    "Summary",
    "Target",
    "TargetMetric",
    "Variant",
    "Variants",
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
