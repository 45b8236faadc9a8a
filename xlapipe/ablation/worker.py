"""Run one variant of a function target in this (fresh) process.

``python -m xlapipe.ablation.worker --function MODULE:FN --pipeline JSON --report PATH [--kwargs JSON]
[--import MODULE ...]``

``MODULE`` is an importable module or a ``path/to/file.py``; ``FN(pipeline, **kwargs)``
trains and returns the report (a dict, see the workload contract). Each
``--import`` module is imported before the pipeline is rebuilt: it registers
practices of the user's own (``xlapipe ablate --import``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def load_function(spec: str) -> Callable[..., dict]:
    """``module:function`` or ``path/file.py:function`` -> the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a function target is MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.exists():
            raise FileNotFoundError(f"no such file {module_name!r} (function target {spec!r})")
        sys.path.insert(0, str(path.resolve().parent))
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ImportError(f"cannot load {module_name!r} as a module (function target {spec!r})")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[path.stem] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise AttributeError(f"{module_name} has no {attr!r} (function target {spec!r})")
    if not callable(fn):
        raise TypeError(f"{spec} is a {type(fn).__name__}, not a function")
    function: Callable[..., dict] = fn
    return function


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xlapipe.ablation.worker", description=__doc__)
    parser.add_argument("--function", required=True, help="MODULE:FUNCTION or FILE.py:FUNCTION")
    parser.add_argument("--pipeline", required=True, help="JSON pipeline description")
    parser.add_argument("--report", required=True, help="where to write the report (JSON)")
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the function")
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="register its practices",
    )
    opts = parser.parse_args(argv)

    from xlapipe import runtime

    runtime.ensure_pjrt_device()
    from xlapipe.pipeline import Pipeline

    kwargs = json.loads(opts.kwargs)
    if not isinstance(kwargs, dict):
        parser.error(f"--kwargs must be a JSON object, got {opts.kwargs!r}")
    fn = load_function(opts.function)  # first: its module may register transforms
    from xlapipe.ablation.harness import import_modules

    import_modules(opts.imports)
    pipeline = Pipeline.from_description(json.loads(opts.pipeline))
    report = fn(pipeline, **kwargs)
    if not isinstance(report, dict):
        raise TypeError(f"{opts.function} must return a dict report, returned {type(report).__name__}")
    report.setdefault("pipeline", repr(pipeline))
    report.setdefault("pipeline_description", pipeline.describe())
    Path(opts.report).write_text(json.dumps(report, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
