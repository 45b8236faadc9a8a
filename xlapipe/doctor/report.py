"""The doctor's report: a short terminal summary (worst first), JSON, and a folder with markdown and the pipeline."""

from __future__ import annotations

import json
import os
import shlex
import textwrap
from typing import Any

from xlapipe.doctor.diagnose import Diagnosis
from xlapipe.doctor.findings import Finding, plural, seconds

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
PIPELINE_PY = "pipeline.py"
PIPELINE_JSON = "pipeline.json"


def _shown(args: list[str], longest: int = 60) -> str:
    """The script's arguments as a shell would take them, a long one (a JSON pipeline) cut short."""
    short = [" ".join(a.split()) for a in args]
    return " ".join(shlex.quote(a if len(a) <= longest else a[: longest - 3] + "...") for a in short)


def _cost(f: Finding) -> str:
    if f.cost_s is None:
        return ""
    return f"about {seconds(f.cost_s)} per step"


def _setup_lines(d: Diagnosis) -> list[str]:
    s = d.setup
    lines = []
    rt = s.get("runtime")
    if rt:
        env = ", ".join(f"{k}={v}" for k, v in sorted((rt.get("env") or {}).items()))
        lines.append(
            f"runtime: {rt.get('device_type')} ({plural(rt.get('devices') or 0, 'device')}, world size "
            f"{rt.get('world_size')}), default dtype {rt.get('default_dtype')}" + (f"; {env}" if env else "")
        )
    if rt and rt.get("backend") == "torch_xla":
        version = (rt.get("versions") or {}).get("torch_xla", "?")
        lines.append(
            f"backend: torch_xla {version}, its last release; TorchTPU (torch_tpu) succeeds it on TPUs "
            "(docs/torchtpu.md)"
        )
    for p in s.get("parameters") or []:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted((p.get("kinds") or {}).items()))
        lines.append(f"parameters ({p.get('optimizer')}): {kinds}")
    if s.get("autocast"):
        lines.append(f"autocast in forward passes: {', '.join(s['autocast'])}")
    practices = s.get("practices")
    lines.append(
        "xlapipe practices on: " + (", ".join(p["name"] for p in practices) or "none")
        if practices is not None
        else "a plain torch_xla script (no xlapipe session)"
    )
    return lines


def summary(d: Diagnosis) -> str:
    """The terminal summary."""
    out = [
        f"xlapipe doctor: {d.script}{' ' + _shown(d.args) if d.args else ''}",
        f"  {plural(d.steps, 'step')} of {d.steps_asked} asked ({d.warmup} warm-up), {d.elapsed_s:.1f} s"
        + (f"; {seconds(d.timing['step_s_median'])} per step after warm-up (median)" if d.timing else ""),
    ]
    out += [f"  {line}" for line in _setup_lines(d)]
    if d.message:
        out += ["", *[f"  {line}" for line in d.message.splitlines()]]
    if d.steps > d.warmup or d.findings:
        out += ["", f"{plural(len(d.findings), 'finding')}" + (", worst first:" if d.findings else ".")]
        for i, f in enumerate(d.findings, 1):
            ranks = (
                f" (rank{'s' if len(f.ranks) > 1 else ''} {', '.join(map(str, f.ranks))})" if f.ranks else ""
            )
            out.append(
                f"{i}. {f.kind} at {f.where or '(no one line)'}{ranks}" + (f": {f.code}" if f.code else "")
            )
            cost = _cost(f)
            for text, label in ((f.detail + (f" ({cost})" if cost else ""), ""), (f.fix, "fix: ")):
                out += textwrap.wrap(label + text, 100, initial_indent="   ", subsequent_indent="     ")
    if d.suggestion is not None:
        out += [
            "",
            "suggested pipeline (xlapipe):",
            *[f"  {line}" for line in d.suggestion.python.splitlines()[2:]],
        ]
        if d.suggestion.note:
            out.append(f"  ({d.suggestion.note})")
    if d.overhead:
        o = d.overhead
        out += [
            "",
            f"overhead: {seconds(o['probed_step_s_median'])} per step under the doctor against "
            f"{seconds(o['plain_step_s_median'])} plain (x{o['ratio']:g}); whole runs {o['probed_run_s']:.1f} s "
            f"against {o['plain_run_s']:.1f} s",
        ]
    return "\n".join(out)


def write_json(d: Diagnosis, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d.to_json(), f, indent=2, sort_keys=False)
        f.write("\n")


def markdown(d: Diagnosis) -> str:
    """The report as markdown: the summary's content, with a table of the findings."""
    out = [
        f"# xlapipe doctor: `{d.script}`",
        "",
        f"Command: `xlapipe doctor {d.script} --steps {d.steps_asked} --warmup {d.warmup}"
        + (f" -- {_shown(d.args)}`" if d.args else "`"),
        "",
        f"{plural(d.steps, 'step')} of {d.steps_asked} asked ({d.warmup} warm-up) in {d.elapsed_s:.1f} s.",
        "",
        *[f"- {line}" for line in _setup_lines(d)],
    ]
    if d.message:
        out += ["", "```", d.message, "```"]
    out += ["", "## Findings", ""]
    if not d.findings:
        out.append("None." if d.steps > d.warmup else "Not diagnosed: no step after warm-up.")
    else:
        out += ["| # | kind | where | per step | cost per step |", "|---|---|---|---|---|"]
        out += [
            f"| {i} | {f.kind} | `{f.where}` | {f.count:.3g} | {seconds(f.cost_s)} |"
            for i, f in enumerate(d.findings, 1)
        ]
        for i, f in enumerate(d.findings, 1):
            out += ["", f"### {i}. {f.kind} at `{f.where or '(no one line)'}`", ""]
            if f.code:
                out += [f"`{f.code}`", ""]
            out += [f.detail, "", f"**Fix:** {f.fix}"]
    if d.suggestion is not None:
        out += ["", "## Suggested pipeline", "", "```python", d.suggestion.python, "```", ""]
        out += ["As JSON (`xp.Pipeline.from_description`):", "", "```json"]
        out += [json.dumps(d.suggestion.description, indent=2), "```"]
        if d.suggestion.note:
            out += ["", d.suggestion.note]
    return "\n".join(out) + "\n"


def write_folder(d: Diagnosis, folder: str) -> list[str]:
    """report.md, report.json and, when there is one, the suggested pipeline as pipeline.py and pipeline.json."""
    os.makedirs(folder, exist_ok=True)
    written: dict[str, Any] = {REPORT_MD: markdown(d)}
    if d.suggestion is not None:
        written[PIPELINE_PY] = d.suggestion.python + "\n"
        written[PIPELINE_JSON] = (
            json.dumps(d.suggestion.description) + "\n"
        )  # one line: --pipeline "$(cat ...)"
    for name in (PIPELINE_PY, PIPELINE_JSON):
        if name not in written and os.path.exists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))  # an earlier run's suggestion is not this one's
    for name, text in written.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    write_json(d, os.path.join(folder, REPORT_JSON))
    return [*written, REPORT_JSON]
