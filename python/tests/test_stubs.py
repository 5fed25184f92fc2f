"""The extension's type stub (`_native.pyi`) describes what the compiled module really has: its
names and parameters. (The Python modules carry their types and docstrings inline.)"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, List, Tuple

import pytest

import candle_ssl
from candle_ssl import _native

PACKAGE = Path(candle_ssl.__file__).parent


def _stub(name: str) -> ast.Module:
    path = PACKAGE / f"{name}.pyi"
    if not path.is_file():
        pytest.skip(f"{path} is not installed with the package")
    return ast.parse(path.read_text(encoding="utf-8"))


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, ast.FunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef):
            yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def _resolve(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return obj


def _is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


def _stub_parameters(node: ast.FunctionDef) -> List[Tuple[str, str, Any]]:
    """(name, kind, default) of each parameter, as `inspect` names kinds."""
    a = node.args
    out: List[Tuple[str, str, Any]] = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(positional, defaults):
        kind = "POSITIONAL_ONLY" if arg in a.posonlyargs else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, _literal(default)))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", _literal(kw_default)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


def _literal(node: Any) -> Any:
    if node is None:
        return inspect.Parameter.empty
    if isinstance(node, ast.Constant) and node.value is Ellipsis:
        return Ellipsis
    return ast.literal_eval(node)


def test_native_stub_names_the_extension_s_contents() -> None:
    tree = _stub("_native")
    stub_names = {
        n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    runtime_names = {n for n in dir(_native) if not n.startswith("_")}
    assert stub_names == runtime_names


def test_native_stub_parameters_match_the_extension() -> None:
    """The native functions' parameter names (pyo3 records them in `__text_signature__`)."""
    tree = _stub("_native")
    for name, node in _functions(tree):
        runtime = _resolve(_native, name)
        if _is_property(node):
            continue
        try:
            signature = inspect.signature(runtime)
        except (TypeError, ValueError):
            continue  # no signature recorded
        got = [p for p in signature.parameters if p not in ("self", "cls", "$self", "$cls")]
        want = [p[0] for p in _stub_parameters(node) if p[0] not in ("self", "cls")]
        assert want == got, name
