"""Every bad input in bad_inputs/ gets the error it should; docs/errors.md shows them all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bad_inputs import CASES, message_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_case_ids_are_unique():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_gets_a_clear_error(case):
    with pytest.raises(case.raises) as info:
        case.call()
    assert case.fragment in message_of(info.value)


def test_docs_errors_table_is_current():
    # A fresh process: the messages name what is registered, and earlier tests register more.
    tool = os.path.join(ROOT, "tools", "error_table.py")
    done = subprocess.run(
        [sys.executable, tool, "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
