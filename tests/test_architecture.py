"""The house rules of docs/design/, read from the source: no import cycles, akocore stays pure.

Imports are read with `ast` (nothing is imported), at module level and inside
functions alike, except under ``if TYPE_CHECKING:``. A cycle counts whatever
the level at which its imports sit: a lazy import that hides a cycle is still one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("akocore", "akosim", "akorun", "analysis")
# What akocore may not use: clocks, sockets, event loops, subprocesses, the shells.
IMPURE_FOR_AKOCORE = {"time", "asyncio", "socket", "aiohttp", "simpy", "subprocess", "threading",
                      "akosim", "akorun", "analysis"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, module: str) -> set[str]:
    """Every absolute dotted name a module imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            # "akocore.config.RunConfig" -> the longest prefix that is a module
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    if candidate != module:
                        targets.add(candidate)
                    break
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                strongconnect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return found


def _ignores_package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its own submodules is not a cycle with them:
    drop edges from a submodule to its own parent package's __init__."""
    return {module: {target for target in targets if not module.startswith(target + ".")}
            for module, targets in graph.items()}


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_project_modules(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source = package / "mod.py"
    source.write_text("from .other import thing\nfrom . import sibling\n")
    assert imported_names(source, "pkg.mod") == {"pkg.other", "pkg.other.thing", "pkg",
                                                  "pkg.sibling"}


def test_no_import_cycle_between_project_modules():
    found = cycles(_ignores_package_parents(import_graph()))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(("shell", "other"), [("akosim", "akorun"), ("akorun", "akosim")])
def test_the_shells_do_not_import_each_other(shell, other):
    offenders = sorted(module for module, targets in import_graph().items()
                       if module.split(".")[0] == shell
                       and any(t.split(".")[0] == other for t in targets))
    assert offenders == []


def test_akocore_uses_no_clock_socket_event_loop_or_shell():
    offenders = []
    for module, path in project_modules().items():
        if module.split(".")[0] != "akocore":
            continue
        for name in imported_names(path, module):
            if name.split(".")[0] in IMPURE_FOR_AKOCORE:
                offenders.append(f"{module} imports {name}")
    assert offenders == []


def _module_level_calls(tree: ast.Module) -> list[ast.Call]:
    """Calls that run when the module is imported (not inside a def or a class body's def)."""
    calls: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.Call):
            calls.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return calls


def test_akocore_changes_global_jax_settings_only_in_its_one_explicit_edge():
    """jax.config changes live in akocore.process_setup, inside functions a shell calls;
    importing akocore changes nothing."""
    for module, path in project_modules().items():
        if module.split(".")[0] != "akocore":
            continue
        text = path.read_text(encoding="utf-8")
        at_import = [ast.unparse(call.func) for call in _module_level_calls(ast.parse(text))]
        assert not [name for name in at_import if name.startswith("jax.config")], module
        if module != "akocore.process_setup":
            assert "jax.config.update" not in text, module
