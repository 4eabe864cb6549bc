"""The package modules a module imports, read from its source (AST), never imported.

One reader for the three that need it: dvc.yaml's code deps (:mod:`.code_closure`: imports that
run), the layer rule (``tests/test_layers.py``: every import, typing ones and modules named by
string included) and the import graph's counts (``benchmarks/import_graph.py``). An import
resolves to the deepest package module it names: ``from .x import y`` to ``x.y`` when that is
a module, else ``x``; a lazily exported name (``lazy.lazy_exports``) to the submodule behind it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class PackageSource:
    """A package's source tree: ``src`` holds the folder ``name``."""

    src: Path
    name: str

    def module_file(self, module: str) -> Path | None:
        """The source file of a package module, or None when it is not one."""
        if module.split(".")[0] != self.name:
            return None
        base = self.src.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                return path
        return None

    def file(self, module: str) -> Path:
        """The source file of a package module (which must be one)."""
        path = self.module_file(module)
        if path is None:
            raise ValueError(f"{module} is no module of {self.name}")
        return path

    def modules(self) -> dict[str, Path]:
        """Every module of the package, by dotted name."""
        return {".".join(path.relative_to(self.src).with_suffix("").parts)
                .removesuffix(".__init__"): path for path in (self.src / self.name).rglob("*.py")}

    def is_package(self, module: str) -> bool:
        path = self.module_file(module)
        return path is not None and path.name == "__init__.py"

    def tree(self, module: str) -> ast.Module:
        return _tree(self, module)

    def deepest(self, name: str) -> str | None:
        """The deepest package module that a dotted name starts with (None outside it)."""
        while name and self.module_file(name) is None:
            name = name.rpartition(".")[0]
        return name or None

    def from_base(self, module: str, node: ast.ImportFrom) -> str:
        """The module a ``from ... import`` inside ``module`` imports from."""
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        parts = parts[: len(parts) - node.level + self.is_package(module)]
        return ".".join(parts + ([node.module] if node.module else []))

    def targets(self, module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
        """The deepest package modules an import statement inside ``module`` names."""
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = self.from_base(module, node)
            exports = _lazy_exports(self, base)
            names = [f"{base}.{exports.get(alias.name, alias.name)}" for alias in node.names]
        return {found for name in names if (found := self.deepest(name))}

    def imports(self, module: str, nodes: Iterable[ast.AST] | None = None, *,
                typing: bool = False) -> list[tuple[int, str]]:
        """(line, package module) of each import statement under ``nodes`` (default: the
        whole module), nested ones included; with ``typing``, those of ``if TYPE_CHECKING:``
        blocks too (they never run)."""
        return [(node.lineno, target)
                for node in _walk(self._nodes(module, nodes), typing)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for target in sorted(self.targets(module, node))]

    def named(self, module: str, nodes: Iterable[ast.AST] | None = None
              ) -> list[tuple[int, str]]:
        """(line, package module) of each string under ``nodes`` that names a package module
        (``"pkg.stage.module"``, ``"pkg.module:function"``): a registry that imports it by
        name."""
        pattern = re.compile(rf"{self.name}(\.\w+)+(:\w+)?")
        return [(node.lineno, target) for node in _walk(self._nodes(module, nodes), True)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and pattern.fullmatch(node.value)
                and (target := self.deepest(node.value.partition(":")[0]))]

    def _nodes(self, module: str, nodes: Iterable[ast.AST] | None) -> Iterable[ast.AST]:
        return [self.tree(module)] if nodes is None else nodes


def typing_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports never run."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def parents(module: str) -> set[str]:
    """A dotted module and the packages above it (imported before it)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _walk(nodes: Iterable[ast.AST], typing: bool) -> Iterator[ast.AST]:
    todo = [n for n in nodes if typing or not typing_only(n)]
    while todo:
        node = todo.pop()
        yield node
        todo += [c for c in ast.iter_child_nodes(node) if typing or not typing_only(c)]


@cache
def _tree(source: PackageSource, module: str) -> ast.Module:
    return ast.parse(source.file(module).read_text(encoding="utf-8"))


@cache
def _lazy_exports(source: PackageSource, package: str) -> dict[str, str]:
    """The ``lazy_exports`` map of a package (name -> its submodule), empty for other modules:
    ``from package import name`` loads that submodule when the name is used."""
    if not source.is_package(package):
        return {}
    for node in ast.walk(source.tree(package)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):
            pairs = zip(node.args[1].keys, node.args[1].values, strict=True)
            return {k.value: v.value for k, v in pairs if isinstance(k, ast.Constant)
                    and isinstance(v, ast.Constant) and isinstance(k.value, str)
                    and isinstance(v.value, str)}
    return {}
