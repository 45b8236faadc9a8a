"""Every bad input in bad_inputs.py gets the error it should; docs/errors.md shows them all."""
from __future__ import annotations

import importlib.util
import os

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
    spec = importlib.util.spec_from_file_location("error_table", os.path.join(ROOT, "tools", "error_table.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    sections, _ = tool.run_all()
    assert all(o.ok for outcomes in sections.values() for o in outcomes)
    with open(tool.DOC) as f:
        assert f.read() == tool.render(sections), "docs/errors.md is stale: run .venv/bin/python tools/error_table.py"
