"""The package's structure: no import cycles among gpuagent's modules, and every
dataclass of the shared data model has annotations `typing.get_type_hints` resolves."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuagent
import gpuagent.inventory.model
import gpuagent.model

PACKAGE_DIR = Path(gpuagent.__file__).resolve().parent
ROOT = "gpuagent"

# Import cycles allowed for now, each with the reason it is still there: the test fails
# on any cycle not listed, and on a listed one that no longer exists (delete its entry).
# Each entry is the frozenset of the cycle's module names, with its reason as a comment
# (for instance gpuagent.daemon and gpuagent.daemon_api: "being split by the node-daemon
# restructuring"). None is needed today: gpuagent.daemon <-> gpuagent.daemon_api (being split by the
# node-daemon restructuring), sim.gpu <-> sim.readings and sim.replay <-> sim.scenario
# refer to each other only under `if TYPE_CHECKING:`, which imports nothing at runtime.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


# --- the import graph --------------------------------------------------------------------


def module_names() -> dict[str, Path]:
    """Every gpuagent module (a package as its own name), to its file."""
    modules: dict[str, Path] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_statements(
    nodes: list[ast.stmt], *, deferred: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: at module level, in `if`/`try`/`with`
    blocks and class bodies, but not under `if TYPE_CHECKING:` and (unless ``deferred``)
    not in functions. With ``deferred``, the imports functions run later count as well."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from import_statements(node.orelse, deferred=deferred)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not deferred:
            continue
        else:  # the blocks inside: if/else, try/except/finally, with, for, match, class
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from import_statements([child], deferred=deferred)
                elif isinstance(child, ast.excepthandler | ast.match_case):
                    yield from import_statements(child.body, deferred=deferred)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(
    name: str, path: Path, modules: dict[str, Path], *, deferred: bool = False
) -> set[str]:
    """The gpuagent modules importing ``name`` executes (its edges in the graph).

    ``import a.b`` and ``from a.b import c`` run ``a.b`` (and ``a.b.c`` when that is a
    module) and the packages above them; a package above ``name`` itself is already being
    imported when ``name`` runs, so that implicit step is no edge. An import that names
    such a package explicitly (``from gpuagent.checks import f`` inside gpuagent.checks.x)
    reads its attributes, so that one is.
    """
    is_package = path.name == "__init__.py"
    own_package = name if is_package else name.rpartition(".")[0]
    explicit: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in import_statements(tree.body, deferred=deferred):
        if isinstance(node, ast.Import):
            explicit.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = own_package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            explicit.add(submodule if submodule in modules else source)
    ancestors = set(_parents(name))
    edges: set[str] = set()
    for target in explicit:
        if target.split(".")[0] != ROOT:
            continue
        edges.add(target)
        edges.update(p for p in _parents(target) if p not in ancestors)
    edges.discard(name)
    return {e for e in edges if e in modules}


def import_graph(*, deferred: bool = False) -> dict[str, set[str]]:
    modules = module_names()
    return {
        name: imports_of(name, path, modules, deferred=deferred) for name, path in modules.items()
    }


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The modules that import each other, directly or through others: the graph's
    strongly connected components of more than one module."""
    reach = {v: _reachable(graph, v) for v in graph}
    found = {frozenset({v} | {w for w in reach[v] if v in reach.get(w, ())}) for v in graph}
    return sorted((c for c in found if len(c) > 1), key=sorted)


def describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return "{" + ", ".join(sorted(component)) + "}: " + "; ".join(edges)


@pytest.mark.parametrize(
    "deferred",
    [False, True],
    ids=["import_time", "with_imports_in_functions"],
)
def test_gpuagent_has_no_new_import_cycles(deferred: bool) -> None:
    """At import time, and also counting the imports functions make later: a deferred
    import keeps a cycle from failing at import time, but the modules still depend on
    each other (the cordon backends and their factory did)."""
    graph = import_graph(deferred=deferred)
    found = set(cycles(graph))
    new = [describe(c, graph) for c in found - KNOWN_CYCLES]
    assert not new, "import cycles among gpuagent modules:\n" + "\n".join(new)
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not gone, f"cycles in KNOWN_CYCLES no longer exist, remove them: {gone}"


# --- the checker itself, on small graphs and sources ----------------------------------------


def test_cycles_finds_components_and_ignores_acyclic_graphs() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def test_imports_of_follows_module_level_imports_only(tmp_path: Path) -> None:
    pkg = tmp_path / "gpuagent"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "c.py", "d.py", "sub/__init__.py", "sub/x.py"):
        (pkg / name).write_text("")
    source = pkg / "sub" / "y.py"
    source.write_text(
        "from __future__ import annotations\n"
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "import gpuagent.a\n"
        "from gpuagent import b\n"
        "from . import x\n"
        "from ..c import thing\n"
        "if TYPE_CHECKING:\n"
        "    from gpuagent import d\n"
        "try:\n"
        "    import yaml\n"
        "except ImportError:\n"
        "    from gpuagent.sub import x as yaml\n"
        "class K:\n"
        "    def later(self):\n"
        "        from gpuagent import e\n"
    )
    modules = {
        "gpuagent": pkg,
        "gpuagent.a": pkg,
        "gpuagent.b": pkg,
        "gpuagent.c": pkg,
        "gpuagent.d": pkg,
        "gpuagent.e": pkg,
        "gpuagent.sub": pkg,
        "gpuagent.sub.x": pkg,
        "gpuagent.sub.y": source,
    }
    assert imports_of("gpuagent.sub.y", source, modules) == {
        "gpuagent.a",
        "gpuagent.b",
        "gpuagent.c",
        "gpuagent.sub.x",
    }
    assert imports_of("gpuagent.sub.y", source, modules, deferred=True) == {
        "gpuagent.a",
        "gpuagent.b",
        "gpuagent.c",
        "gpuagent.e",
        "gpuagent.sub.x",
    }
    # Importing a module of another package runs that package's __init__ first.
    other = pkg / "e.py"
    other.write_text("from gpuagent.sub.x import f\n")
    assert imports_of("gpuagent.e", other, modules) == {"gpuagent.sub", "gpuagent.sub.x"}


# --- the data model's annotations --------------------------------------------------------


MODEL_MODULES = ("gpuagent.model", "gpuagent.inventory.model")


def model_dataclasses() -> list[type]:
    found: list[type] = []
    for module_name in MODEL_MODULES:
        module = importlib.import_module(module_name)
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and dataclasses.is_dataclass(value)
            and value.__module__ == module_name
        )
    return found


def test_every_model_dataclass_is_found() -> None:
    names = {cls.__qualname__ for cls in model_dataclasses()}
    assert {"NodeSnapshot", "GpuReadings", "NodeInventory", "HostFacts"} <= names


@pytest.mark.parametrize("cls", model_dataclasses(), ids=lambda cls: cls.__qualname__)
def test_type_hints_resolve(cls: type) -> None:
    hints = typing.get_type_hints(cls)
    assert set(hints) >= {f.name for f in dataclasses.fields(cls)}


def test_node_snapshot_type_hints() -> None:
    hints = typing.get_type_hints(gpuagent.model.NodeSnapshot)
    assert hints["inventory"] == gpuagent.inventory.model.NodeInventory | None
    readings = typing.get_type_hints(gpuagent.model.GpuReadings)
    assert readings["fabric_state"] == gpuagent.inventory.model.FabricState | None
