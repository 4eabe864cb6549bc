"""The package's import graph: modules and packages, arrows, floors and cycles.

Every import statement of ``src/hwgptbench`` that runs counts (function-level ones too; those
of ``if TYPE_CHECKING:`` blocks do not), resolved to the package module it loads by
``hwgptbench.pipeline.source_imports`` (the reader of dvc.yaml's code deps and of the layer
test). At the package level a node is a top-level package or module of ``hwgptbench``. Floors
are the nodes on the longest chain of imports once each cycle is taken as one node; the stage
arrows are those from one stage package to another (``tests/test_layers.py`` names the
foundations, and holds the stage arrows at zero).

    python benchmarks/import_graph.py                 # this checkout
    python benchmarks/import_graph.py --root OTHER    # another checkout, e.g. a git worktree
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hwgptbench.pipeline.source_imports import PackageSource  # noqa: E402
from test_layers import FOUNDATIONS  # noqa: E402

Graph = dict[str, set[str]]


def module_graph(source: PackageSource) -> Graph:
    """Module -> the package modules its imports that run resolve to."""
    return {module: {target for _, target in source.imports(module)} - {module, source.name}
            for module in source.modules()}


def components(graph: Graph) -> list[set[str]]:
    """The strongly connected components (Kosaraju)."""
    order: list[str] = []
    seen: set[str] = set()
    for start in graph:
        stack = [(start, iter(sorted(graph[start])))]
        if start in seen:
            continue
        seen.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                order.append(node)
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(sorted(graph[child]))))
    reverse: Graph = defaultdict(set)
    for node, targets in graph.items():
        for target in targets:
            reverse[target].add(node)
    found: list[set[str]] = []
    assigned: set[str] = set()
    for start in reversed(order):
        if start in assigned:
            continue
        component, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node in assigned:
                continue
            assigned.add(node)
            component.add(node)
            todo += reverse[node] - assigned
        found.append(component)
    return found


def floors(graph: Graph) -> int:
    """Nodes on the longest import chain, each cycle counted as one node."""
    groups = components(graph)
    group_of = {node: i for i, group in enumerate(groups) for node in group}
    condensed: dict[int, set[int]] = {i: set() for i in range(len(groups))}
    for node, targets in graph.items():
        condensed[group_of[node]] |= {group_of[t] for t in targets} - {group_of[node]}
    height: dict[int, int] = {}

    def measure(group: int) -> int:
        if group not in height:
            height[group] = 1 + max((measure(g) for g in condensed[group]), default=0)
        return height[group]

    sys.setrecursionlimit(10_000)
    return max(measure(g) for g in condensed)


def packages(graph: Graph) -> Graph:
    """The graph between top-level packages and modules."""
    top: Graph = defaultdict(set)
    for node, targets in graph.items():
        mine = node.split(".")[1] if "." in node else node
        top[mine] |= {t.split(".")[1] for t in targets if "." in t} - {mine}
    return dict(top)


def describe(label: str, graph: Graph, cycles: Iterable[set[str]]) -> str:
    arrows = sum(len(t) for t in graph.values())
    cyclic = [sorted(c) for c in cycles if len(c) > 1]
    return (f"{label}: {len(graph)} nodes, {arrows} arrows, {floors(graph)} floors, "
            f"cycles {cyclic or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO, help="checkout (default: this one)")
    args = parser.parse_args()
    package = args.root / "src" / "hwgptbench"
    modules = module_graph(PackageSource(package.parent, package.name))
    top = packages(modules)
    stages = {p.name for p in package.iterdir() if (p / "__init__.py").exists()} - FOUNDATIONS
    stage_arrows = sorted(f"{a} -> {b}" for a, targets in top.items() if a in stages
                          for b in targets if b in stages)
    print(describe("modules", modules, components(modules)))
    print(describe("packages", top, components(top)))
    print(f"stage -> stage arrows: {len(stage_arrows)} {stage_arrows or ''}")


if __name__ == "__main__":
    main()
