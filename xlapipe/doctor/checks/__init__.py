"""The checks, one module per kind of finding; each reads a :class:`~xlapipe.doctor.findings.Context`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xlapipe.doctor.checks import (
    environment,
    executions,
    fallbacks,
    host_reads,
    input_wait,
    optimizer,
    recompiles,
    wrong_results,
)
from xlapipe.doctor.findings import Context, Finding

CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (
    wrong_results.check,
    optimizer.check,
    recompiles.check,
    host_reads.check,
    fallbacks.check,
    input_wait.check,
    executions.check,
    environment.check,
)


def run_all(context: Context) -> list[Finding]:
    """Every check's findings, worst first (:func:`worst_first`)."""
    return worst_first(f for check in CHECKS for f in check(context))


def worst_first(found: Iterable[Finding]) -> list[Finding]:
    """A model that does not train first, then the most seconds per step, then setup findings."""
    return sorted(found, key=lambda f: (f.kind not in SILENT, f.cost_s is None, -(f.cost_s or 0.0)))


SILENT = ("wrong_result", "optimizer")  # a wrong result: worse than any slow-down
