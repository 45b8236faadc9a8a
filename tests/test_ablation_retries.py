"""A failed ablation run is run again on resume, and its success replaces the failure."""

from __future__ import annotations

import functools
from pathlib import Path

from xlapipe.ablation import Judging, Output, Runs, Variants, ablate
from xlapipe.ablation import results as store

FLAKY = f"{Path(__file__).parent / 'workloads' / 'flaky.py'}:train"


def test_failed_runs_are_retried_and_the_retry_replaces_the_failure(tmp_path):
    out = tmp_path / "abl"
    variants = [{"name": "eager", "pipeline": []}]
    kwargs = {"marker": str(tmp_path / "failed-once"), "max_steps": 2, "warmup": 1}
    run = functools.partial(
        ablate,
        FLAKY,
        kwargs,
        variants=Variants(mode="explicit", explicit=variants),
        judging=Judging(repeats=1, until_resolved=False),
        runs=Runs(timeout=300),
        output=Output(out, progress=False, echo=None),
    )
    first = run()
    assert not first.ok and first["eager"].runs == "0/1 ok, 1 error"
    again = run()
    records = store.load(out / store.RESULTS_FILE)
    assert [r["status"] for r in records] == ["error", "ok"]  # run again, the failure kept on file
    assert again.ok and again["eager"].runs == "1/1 ok"  # ... and replaced in the results
    assert again["eager"].figures["final_loss"].n == 1
