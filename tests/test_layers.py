"""The import structure: no import cycles, and the layer contracts of pyproject.toml kept.

The module graph is grimp's, the one import-linter checks: every import of the four packages,
at module level or inside a function, and those under ``if TYPE_CHECKING:``. Both tools come
with the ``test`` extra; without it these tests skip, saying so.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

grimp = pytest.importorskip(
    "grimp", reason="grimp comes with the test extra: pip install -e .[test]"
)
pytest.importorskip("importlinter", reason="import-linter comes with the test extra")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "providers", "pricing", "tasks")

Graph = Mapping[str, Iterable[str]]

# Imports under ``if TYPE_CHECKING:`` that close a cycle, allowed only while they stay
# type-only (they run no code, so they cannot make an import order fail). Each is a design
# debt: delete its entry once the cycle is gone.
TYPE_ONLY_CYCLE_IMPORTS: set[tuple[str, str]] = set()


def import_graph(*, type_checking: bool) -> dict[str, set[str]]:
    """Each module of the packages -> the modules of the packages it imports."""
    graph = grimp.build_graph(
        *PACKAGES, exclude_type_checking_imports=not type_checking, cache_dir=None
    )
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components that hold a cycle, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # Tarjan's algorithm without recursion: (module, its imports still to visit)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, todo = work[-1]
            for imported in todo:
                if imported not in index:
                    index[imported] = low[imported] = len(index)
                    stack.append(imported)
                    on_stack.add(imported)
                    work.append((imported, iter(sorted(graph.get(imported, ())))))
                    break
                if imported in on_stack:
                    low[module] = min(low[module], index[imported])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1 or module in graph.get(module, ()):
                        found.append(sorted(component))
    return sorted(found)


def cycle_path(graph: Graph, component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, as ``a, b, ..., a``."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in sorted(graph.get(module, ())):
                if imported == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if imported in members and imported not in came_from:
                    came_from[imported] = module
                    following.append(imported)
        frontier = following
    raise ValueError(f"no cycle through {start}")


def describe(graph: Graph, found: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle_path(graph, component)) for component in found)


def test_cycle_finder_finds_cycles_and_only_cycles() -> None:
    graph = {
        "a": {"b"},
        "b": {"c", "d"},
        "c": {"a"},
        "d": {"e"},
        "e": set(),
        "f": {"f"},
        "g": {"a"},
    }
    found = cycles(graph)
    assert found == [["a", "b", "c"], ["f"]]
    assert describe(graph, found) == "a -> b -> c -> a\nf -> f"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_cycle_finder_survives_a_long_chain() -> None:
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)} | {"m5000": {"m0"}}
    assert cycles(chain) == [sorted(chain)]


def test_no_import_cycles() -> None:
    full = import_graph(type_checking=True)
    runtime = import_graph(type_checking=False)
    allowed = {
        (importer, imported)
        for importer, imported in TYPE_ONLY_CYCLE_IMPORTS
        if imported not in runtime.get(importer, set())
    }
    graph = {m: {i for i in imports if (m, i) not in allowed} for m, imports in full.items()}
    found = cycles(graph)
    assert not found, "import cycles (each shown as one loop through it):\n" + describe(
        graph, found
    )


def test_the_graph_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    # guards the cycle test against a grimp that stops seeing either kind of import
    full = import_graph(type_checking=True)
    runtime = import_graph(type_checking=False)
    assert "broker.sim.scenario" in full["broker.sim.history"]  # under TYPE_CHECKING
    assert "broker.sim.scenario" not in runtime["broker.sim.history"]
    assert "boto3" not in full  # external packages are left out
    assert sum(len(imports) for imports in full.values()) > 300


def test_the_simulator_imports_only_the_core_and_the_traces() -> None:
    # the sim-pure contract lists pricing's other modules; this also covers new ones
    graph = import_graph(type_checking=True)
    allowed = ("broker.core", "broker.sim", "pricing.traces")
    stray = {
        (module, imported)
        for module, imports in graph.items()
        if module.startswith("broker.sim")
        for imported in imports
        if not any(imported == a or imported.startswith(a + ".") for a in allowed)
    }
    assert not stray


def test_layer_contracts_are_kept() -> None:
    """Runs ``lint-imports`` on the contracts in pyproject.toml."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(no_cache=True, no_logo=True))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
