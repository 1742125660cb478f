"""The package's imports go one way: no module imports itself back through others, and
the core (``domain``, ``timing``, ``store``, ``scheduler``) never reaches up into the
API, the CLI or the worker SDK.

Read from the source with ``ast``, not by importing: every ``import cronwheel…`` and
``from cronwheel… import`` counts, at the top level, inside functions and under
``TYPE_CHECKING`` alike — a cycle hidden in a function is still a cycle of the design.
"""

from __future__ import annotations

import ast
from collections.abc import Container, Iterator, Mapping
from pathlib import Path

import pytest

import cronwheel

PACKAGE = Path(cronwheel.__file__).parent
CORE = ("cronwheel.domain", "cronwheel.timing", "cronwheel.store", "cronwheel.scheduler")
# ``cronwheel.cli`` and its siblings ``cronwheel.cli_*`` alike.
ABOVE_CORE = ("cronwheel.api", "cronwheel.cli", "cronwheel.worker")

Graph = Mapping[str, frozenset[str]]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(f"{prefix}.")


def _imported(tree: ast.AST, modules: Container[str]) -> Iterator[str]:
    """The package's modules ``tree`` imports. ``from p import n`` imports the module
    ``p.n`` when there is one (only the path goes through ``p``), else a name of ``p``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    yield submodule
                elif node.module in modules:
                    yield node.module


def import_graph(root: Path = PACKAGE) -> dict[str, frozenset[str]]:
    """Each module of the package, with the package's modules it imports."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {
        name: frozenset(_imported(ast.parse(path.read_text("utf-8")), files))
        for name, path in files.items()
    }


def _reachable(graph: Graph, start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others (itself only through
    a cycle)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph[name]
    return seen


def cycles(graph: Graph) -> list[list[str]]:
    """The groups of modules that import one another, each sorted: every import cycle
    lies wholly inside one of them (its strongly connected component)."""
    reach = {name: _reachable(graph, name) for name in graph}
    groups = {
        frozenset(m for m in reach[name] if name in reach[m])
        for name in graph
        if name in reach[name]
    }
    return sorted(sorted(group) for group in groups)


def layer_breaches(graph: Graph) -> list[str]:
    return sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if any(_within(source, core) for core in CORE)
        for target in targets
        if any(target == top or target.startswith((f"{top}.", f"{top}_")) for top in ABOVE_CORE)
    )


GRAPH = import_graph()


def test_the_graph_sees_the_package() -> None:
    assert "cronwheel.scheduler.node" in GRAPH
    assert "cronwheel.store.base" in GRAPH["cronwheel.scheduler.node"]
    # A function-level import counts.
    assert "cronwheel.api.metrics" in GRAPH["cronwheel.runtime"]


def test_the_package_has_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert found == [], "modules that import one another: " + "; ".join(map(", ".join, found))


def test_the_core_does_not_import_the_layers_above_it() -> None:
    assert layer_breaches(GRAPH) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": frozenset({"b"}), "b": frozenset()}, []),
        ({"a": frozenset({"a"})}, [["a"]]),
        (
            {
                "a": frozenset({"b"}),
                "b": frozenset({"c"}),
                "c": frozenset({"a", "d"}),
                "d": frozenset(),
            },
            [["a", "b", "c"]],
        ),
        (
            {
                "a": frozenset({"b"}),
                "b": frozenset({"a"}),
                "c": frozenset({"d"}),
                "d": frozenset({"c"}),
            },
            [["a", "b"], ["c", "d"]],
        ),
    ],
)
def test_cycles_are_found(graph: Graph, expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_imports_are_read_at_every_level() -> None:
    source = """
from cronwheel.store import pg_hot, Store
import cronwheel.api
if TYPE_CHECKING:
    from cronwheel.cli import app
def f():
    from cronwheel.worker.sdk import Worker
"""
    modules = {"cronwheel.store", "cronwheel.store.pg_hot", "cronwheel.api"}
    modules |= {"cronwheel.cli", "cronwheel.worker.sdk", "cronwheel.timing"}
    assert set(_imported(ast.parse(source), modules)) == modules - {"cronwheel.timing"}


def test_breaches_are_imports_from_the_core_upwards() -> None:
    graph = {
        "cronwheel.scheduler.node": frozenset({"cronwheel.cli_alerts", "cronwheel.client"}),
        "cronwheel.store.sql.core": frozenset({"cronwheel.worker"}),
        "cronwheel.api.app": frozenset({"cronwheel.store", "cronwheel.worker"}),
    }
    assert layer_breaches(graph) == [
        "cronwheel.scheduler.node imports cronwheel.cli_alerts",
        "cronwheel.store.sql.core imports cronwheel.worker",
    ]
