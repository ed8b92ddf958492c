"""Rules of the package layout, checked on the source (AST only; nothing is imported).

* no module of ``adaptmg/`` over 700 lines (two known exceptions, below);
* only ``adaptmg/backend.py`` tells NumPy from CuPy by a type's ``__module__`` and
  imports CuPy when a module is imported (other modules go through its helpers:
  ``is_device_array``, ``backend_of``, ...; a CuPy import inside a function is allowed);
* no import circle between modules: module-level imports form a DAG, and no
  import is tucked into a function because hoisting it would close a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "adaptmg"
MAX_LINES = 700
# Known exceptions (none now; list a module here only while a split is under way).  Remove an
# entry once its module is split: the test below fails while a listed module is short.
TOO_LONG_FOR_NOW = set()
CUPY_PACKAGES = ("cupy", "cupyx", "cupy_backends")


def _modules():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p):
    return p.relative_to(PKG).as_posix()


def _tree(p):
    return ast.parse(p.read_text(encoding="utf-8"), filename=str(p))


def test_modules_have_at_most_700_lines():
    lengths = {_rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    assert len(lengths) > 50                       # the walk found the package
    too_long = {m: n for m, n in lengths.items() if n > MAX_LINES and m not in TOO_LONG_FOR_NOW}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by purpose): {too_long}"
    stale = {m: lengths.get(m) for m in TOO_LONG_FOR_NOW if lengths.get(m, 0) <= MAX_LINES}
    assert not stale, f"no longer over {MAX_LINES} lines, drop from TOO_LONG_FOR_NOW: {stale}"


def _runs_at_import(tree):
    """Nodes executed when the module is imported: everything outside function bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(ch for ch in ast.iter_child_nodes(node)
                    if not isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def _in_fstring(tree):
    """ids of the nodes inside f-strings (a type's module named in a message is fine)."""
    return {id(n) for js in ast.walk(tree) if isinstance(js, ast.JoinedStr) for n in ast.walk(js)}


def module_uses(tree):
    """(line, what) for every use of ``__module__`` outside an f-string and every
    module-level import of a CuPy package."""
    quoted = _in_fstring(tree)
    found = []
    for n in ast.walk(tree):
        if id(n) in quoted:
            continue
        if isinstance(n, ast.Attribute) and n.attr == "__module__":
            found.append((n.lineno, "__module__"))
        elif isinstance(n, ast.Constant) and n.value == "__module__":    # getattr(t, "__module__")
            found.append((n.lineno, "'__module__'"))
    for n in _runs_at_import(tree):
        names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                 else [n.module or ""] if isinstance(n, ast.ImportFrom) and n.level == 0 else [])
        found += [(n.lineno, f"import {m}") for m in names if m.split(".")[0] in CUPY_PACKAGES]
    return sorted(found)


def test_checker_sees_what_it_must():
    src = '''
import numpy
from cupyx.scipy import sparse
try:
    import cupy as cp
except ImportError:
    cp = None
def f(a, exc):
    import cupy                                   # inside a function: allowed
    raise TypeError(f"got {type(a).__module__}")  # in a message: allowed
def g(a):
    return type(a).__module__.startswith("cupy") or getattr(type(a), "__module__", "")
'''
    assert module_uses(ast.parse(src)) == [(3, "import cupyx.scipy"), (5, "import cupy"),
                                           (12, "'__module__'"), (12, "__module__")]


def test_only_backend_tells_numpy_from_cupy():
    offenders = {_rel(p): module_uses(_tree(p)) for p in _modules() if _rel(p) != "backend.py"}
    offenders = {m: u for m, u in offenders.items() if u}
    assert not offenders, ("use adaptmg.backend's helpers (is_device_array, backend_of, "
                           f"is_device_sparse, is_device_error, ...) instead: {offenders}")
    assert module_uses(_tree(PKG / "backend.py"))       # the one place that does it


def _module_name(p):
    parts = p.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """Module -> adaptmg modules it imports, at import time and inside functions.
    Packages (``__init__``) are left out: their imports are re-exports."""
    paths = {_module_name(p): p for p in _modules()}
    packages = {_module_name(p) for p in _modules() if p.name == "__init__.py"}
    top, inner = {}, {}
    for mod, p in paths.items():
        if mod in packages:
            continue
        tree = _tree(p)
        at_import = {id(n) for n in _runs_at_import(tree)}
        base = mod.split(".")[:-1]
        top[mod], inner[mod] = set(), set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                pre = (".".join(base[:len(base) - n.level + 1]) if n.level else "")
                mod_from = ".".join(x for x in (pre, n.module) if x)
                targets = [f"{mod_from}.{a.name}" if f"{mod_from}.{a.name}" in paths else mod_from
                           for a in n.names]
            else:
                continue
            targets = {t for t in targets if t in paths and t not in packages and t != mod}
            (top if id(n) in at_import else inner)[mod] |= targets
    return top, inner


def _reaches(graph, a, b):
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            todo.extend(graph.get(x, ()))
    return False


def test_no_import_circles():
    top, inner = import_graph()
    assert "adaptmg.backend" in top["adaptmg.patch.stencil"]       # the graph is real
    circles = sorted((a, b) for a in top for b in top[a] if _reaches(top, b, a))
    assert not circles, f"module-level import circles: {circles}"
    dodges = sorted((a, b) for a in inner for b in inner[a] - top[a] if _reaches(top, b, a))
    assert not dodges, ("imports inside functions that would close an import circle at "
                        f"module level (move the shared piece to a module both import): {dodges}")


@pytest.mark.parametrize("module", ["adaptmg.patch.kernels", "adaptmg.multilevel.smoothers"])
def test_circle_check_would_catch_the_old_circles(module):
    """Re-adding the import that used to close each circle is reported."""
    top, _ = import_graph()
    back = {"adaptmg.patch.kernels": "adaptmg.patch.stencil",
            "adaptmg.multilevel.smoothers": "adaptmg.multilevel.chebyshev"}[module]
    assert back in top[module]
    top[back].add(module)
    assert any(_reaches(top, b, a) for a in top for b in top[a])


def test_modules_compile_without_warnings():
    """An invalid escape in a docstring is a SyntaxWarning at every first import."""
    import warnings
    bad = {}
    for p in _modules():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(p.read_text(encoding="utf-8"), str(p), "exec")
            except (SyntaxWarning, DeprecationWarning) as exc:
                bad[_rel(p)] = str(exc)
    assert not bad, f"modules that warn when compiled: {bad}"
