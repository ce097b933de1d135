"""The build's import plan, read from the source: layers only import downward and nothing imports in a circle.

``models`` (scorer graphs, teacher loader, padded batching) is the bottom of the build; ``compression``
and ``export`` are siblings on it that never import each other; ``evaluation`` (metrics, in-process
speed) sits beside ``models`` for both; ``buildstage`` is the top. Every import counts: module level,
inside functions and under ``TYPE_CHECKING``, absolute or relative.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "slimserve"

# package -> the packages it must never import
FORBIDDEN = {
    "compression": {"export", "buildstage", "serving"},
    "export": {"compression", "buildstage", "serving"},
    "models": {"compression", "export", "evaluation", "buildstage", "serving"},
    "evaluation": {"compression", "export", "buildstage", "serving"},
}
# packages whose modules must not import each other in a circle
ACYCLIC = ("models", "compression", "export", "evaluation", "buildstage")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative).with_suffix(".py").is_file() or (
        PACKAGE.parent / relative / "__init__.py"
    ).is_file()


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported slimserve module, line) of every import in ``path``; ``from pkg import name`` counts as
    importing ``pkg.name`` when that is a module."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.append((child if _is_module(child) else target, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "slimserve"]


def _graph() -> dict[str, list[tuple[str, int, Path]]]:
    return {
        _module_name(path): [(target, line, path) for target, line in _imports(path)]
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_parser_sees_the_imports_it_checks():
    graph = _graph()
    targets = {target for target, _, _ in graph["slimserve.buildstage.runner"]}
    assert "slimserve.buildstage.artifacts" in targets  # from . import artifacts
    assert "slimserve.errors" in targets  # from ..errors import BuildError
    assert "slimserve.models.scorer_graph" in {t for t, _, _ in graph["slimserve.export.onnx_export"]}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_only_import_downward(layer):
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {target}"
        for module, edges in _graph().items()
        if _layer(module) == layer
        for target, line, path in edges
        if _layer(target) in FORBIDDEN[layer]
    ]
    assert not bad, f"{layer} must not import {sorted(FORBIDDEN[layer])}:\n" + "\n".join(bad)


def test_build_modules_import_no_circle():
    graph = {
        module: sorted({t for t, _, _ in edges if _layer(t) in ACYCLIC and t != module})
        for module, edges in _graph().items()
        if _layer(module) in ACYCLIC
    }
    cycles, state = [], {}  # state: 1 on the current path, 2 finished

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph.get(module, ()):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], module, target]))
            elif target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])
    assert not cycles, "import circles:\n" + "\n".join(cycles)
