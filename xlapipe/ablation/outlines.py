"""The driver's pipelines: outlines, rebuilt from descriptions where the practices are imported.

The process that plans an ablation, dispatches its runs and reports never
trains, so it never imports torch (about 500 MB before a single record). It
needs each transform's name, parameters and relations (needs, after,
excludes), which a pipeline's outline holds (:meth:`Pipeline.outline`). A
description given by the user (``--pipeline``, ``--variants``) becomes an
outline by rebuilding it with the practices' factories, which checks it as it
always was: in this process when it has the practices imported already (an
API user's), else in one child process
that imports them and the user's ``--import`` modules (:func:`main`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from xlapipe.pipeline import Pipeline
from xlapipe.transform import OrderError

# The child's command: not ``-m``, since the package imports this module first.
CHILD = "from xlapipe.ablation.outlines import main; main()"


def outlined(pipeline: Pipeline) -> Pipeline:
    """``pipeline`` as an outline: the same names, parameters and relations, torch-free."""
    return Pipeline.from_outline(pipeline.outline())


def outlines(
    values: Sequence[Pipeline | Sequence[Any]], imports: Sequence[str] = (), python: str = sys.executable
) -> list[Pipeline]:
    """Each pipeline, or description rebuilt and checked (all in one go), as an outline.

    Errors are those of :meth:`Pipeline.from_description` (an unknown name, a
    parameter refused, an order broken), with the same message.
    """
    descriptions = [v for v in values if not isinstance(v, Pipeline)]
    checked = descriptions or imports  # imports alone are checked too: a bad one is refused now
    done = iter(rebuilt(descriptions, imports, python) if checked else ())
    return [outlined(v) if isinstance(v, Pipeline) else next(done) for v in values]


def rebuilt(
    descriptions: Sequence[Any], imports: Sequence[str] = (), python: str = sys.executable
) -> list[Pipeline]:
    """Each description (a list of ``{"name", "params"}``) rebuilt and checked, as an outline."""
    if "xlapipe.transforms" in sys.modules:  # the practices are here already: no child to start
        return [outlined(p) for p in _rebuild(descriptions, imports)]
    request = json.dumps({"descriptions": list(descriptions), "imports": list(imports)})
    done = subprocess.run([python, "-c", CHILD], input=request, capture_output=True, text=True)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(
            f"checking the pipelines with {python} failed (exit status {done.returncode}):\n"
            f"{done.stderr[-2000:]}"
        ) from None
    if "error" in answer:
        kind = {"OrderError": OrderError, "TypeError": TypeError}.get(answer["kind"], ValueError)
        if kind is OrderError:
            raise OrderError(answer["relation"], tuple(answer["names"]), answer["error"])
        raise kind(answer["error"])
    return [Pipeline.from_outline(o) for o in answer["outlines"]]


def _rebuild(descriptions: Sequence[Any], imports: Sequence[str]) -> list[Pipeline]:
    from xlapipe.ablation.harness import import_modules

    import_modules(imports)
    return [Pipeline.from_description(d) for d in descriptions]


def _answer(request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        pipelines = _rebuild(request["descriptions"], request["imports"])
    except OrderError as error:
        return {"error": str(error), "kind": "OrderError", "relation": error.relation, "names": error.names}
    except (ValueError, TypeError) as error:
        return {"error": str(error), "kind": type(error).__name__}
    return {"outlines": [p.outline() for p in pipelines]}


def main() -> None:
    """The child: a request (JSON) on stdin, the outlines or the error as the last stdout line."""
    print(json.dumps(_answer(json.load(sys.stdin))))
