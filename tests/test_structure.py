"""The package's layout keeps its promises: no import cycles, every warning class exported."""

from __future__ import annotations

import ast
import pathlib
import warnings

import xlapipe as xp

ROOT = pathlib.Path(xp.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """xlapipe modules ``path`` imports anywhere (functions included), except for type checking."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            }
    return {m for m in found if m in modules}


def test_no_import_cycles_between_modules():
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    packages = {module_name(p) for p in ROOT.rglob("__init__.py")}
    graph = {m: imports(p, modules) - packages for m, p in files.items() if m not in packages}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, sorted({" -> ".join(c) for c in cycles})[:5]


def test_every_warning_and_error_class_is_exported():
    classes = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Warning", "Error"))
                    for b in node.bases
                )
            ):
                classes.add(node.name)
    assert classes, "no warning or error classes found"
    missing = sorted(c for c in classes if c not in xp.__all__)
    assert not missing, f"not exported from xlapipe: {missing}"
    for name in classes:
        cls = getattr(xp, name)
        assert issubclass(cls, (Warning, Exception))
        if issubclass(cls, Warning):
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("error", cls)  # users can filter it by class


def test_every_exported_name_is_the_object_of_its_module_and_import_xlapipe_loads_no_torch():
    import importlib
    import subprocess
    import sys

    for name in xp.__all__:
        value = getattr(xp, name)  # imported when first used
        module = xp._ATTRIBUTES.get(name)
        if module is not None:
            assert value is getattr(importlib.import_module(module), name), name
    assert set(xp.__all__) - {"__version__", "runtime"} == set(xp._ATTRIBUTES) | set(
        xp._MODULES
    )  # runtime: eager
    code = "import sys, xlapipe\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_xla')))"
    code += "\nimport xlapipe.session, xlapipe.launch\nprint(type(xlapipe.session).__name__, xlapipe.launch.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # the modules imported first do not hide the functions of the same names
    assert done.stdout.split() == ["[]", "function", "launch"], (done.stdout, done.stderr[-2000:])
