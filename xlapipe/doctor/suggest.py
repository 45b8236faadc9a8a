"""The suggested pipeline: the practices the script has on (none for a plain script) plus the fixes found."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attrs import frozen

from xlapipe.doctor.findings import Finding


@frozen
class Suggestion:
    """A pipeline as ``Pipeline.from_description`` reads it, and as Python."""

    description: list[dict[str, Any]]
    python: str
    added: tuple[str, ...]  # the practices the findings call for
    note: str = ""  # why it could not be checked, when it could not


def suggest(practices: list[dict[str, Any]] | None, findings: Iterable[Finding]) -> Suggestion | None:
    """None when no finding calls for a practice."""
    wanted: dict[str, dict[str, Any]] = {}
    for f in findings:
        if f.practice is not None:
            wanted.setdefault(f.practice["name"], f.practice)
    if not wanted:
        return None
    given: list[dict[str, Any]] = (
        list(practices) if practices is not None else [{"name": "with_device", "params": {}}]
    )
    base = [{"name": p["name"], "params": dict(p.get("params") or {})} for p in given]
    aside = [
        f"{p['name']}'s {', '.join(f'{k}={v}' for k, v in p['undescribed'].items())}"
        for p in given
        if p.get("undescribed")
    ]
    import xlapipe as xp

    try:
        pipeline = xp.Pipeline.from_description(base)
        for item in wanted.values():
            t = xp.rebuild(item["name"], item.get("params", {}))
            pipeline = pipeline.replace(t) if t.name in pipeline else pipeline + t
        description, note = pipeline.describe(), ""
    except (ValueError, TypeError, xp.OrderError) as error:
        names = {p.get("name") for p in base}
        description = base + [w for w in wanted.values() if w["name"] not in names]
        note = f"not checked against xlapipe's relations here ({error})"
    if aside:
        kept = (
            f"your script passes {'; '.join(aside)}: a function of the script, which pipeline.json "
            "cannot hold; the suggestion keeps the other parameters and uses the default there "
            "(that changes where the values go): pass it again in Python"
        )
        note = f"{note}; {kept}" if note else kept
    return Suggestion(description, python(description), tuple(wanted), note)


def python(description: list[dict[str, Any]]) -> str:
    """The pipeline as Python, each practice with the parameters that differ from its defaults."""
    lines = [f"    xp.{item['name']}({_arguments(item)})," for item in description]
    return "\n".join(["import xlapipe as xp", "", "pipeline = xp.Pipeline(", *lines, ")"])


def _arguments(item: dict[str, Any]) -> str:
    """``item``'s parameters that change the transform: one left out rebuilds it the same, it is a default."""
    import xlapipe as xp

    params = dict(item.get("params") or {})
    try:
        whole = xp.rebuild(item["name"], params).describe()
    except (ValueError, TypeError):
        whole = None
    if whole is not None:
        for key in list(params):
            fewer = {k: v for k, v in params.items() if k != key}
            try:
                if xp.rebuild(item["name"], fewer).describe() == whole:
                    params = fewer
            except (ValueError, TypeError):
                pass
    return ", ".join(f"{k}={_literal(v)}" for k, v in params.items())


def _literal(value: Any) -> str:
    return repr(tuple(_literal_value(v) for v in value)) if isinstance(value, list) else repr(value)


def _literal_value(value: Any) -> Any:
    return tuple(_literal_value(v) for v in value) if isinstance(value, list) else value
