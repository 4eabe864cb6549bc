"""The package modules a subcommand runs, read from the source (AST), never imported.

A subcommand runs its handler and the functions it calls, followed function by function into
the command registries and stage modules; their imports (lazy ones inside functions included,
``if TYPE_CHECKING:`` blocks not), the submodule behind a lazily exported name, and the modules
loaded by name, closed over what those import.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from .source_imports import PackageSource, parents

PACKAGE = "hwgptbench"
SRC = Path(__file__).resolve().parents[2]  # the folder holding the package's source
SOURCE = PackageSource(SRC, PACKAGE)


@cache
def registries() -> frozenset[str]:
    """Modules whose functions import lazily what only some callers use: ``cli.py``, the
    commands registries (each handler imports its stage) and ``compress/stage.py`` (one
    function per subcommand); a subcommand is followed into them function by function."""
    stages = {f"{PACKAGE}.{p.parent.name}.commands" for p in SRC.glob(f"{PACKAGE}/*/commands.py")}
    return frozenset({f"{PACKAGE}.cli", f"{PACKAGE}.commands", f"{PACKAGE}.compress.stage",
                      *stages})


def resolved(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Package modules an import statement inside ``module`` loads (parents included)."""
    return {m for target in SOURCE.targets(module, node) for m in parents(target)}


def imports_in(module: str, nodes: Iterable[ast.AST]) -> set[str]:
    """Package modules loaded by the import statements under nodes (those of
    ``if TYPE_CHECKING:`` blocks aside)."""
    return {m for _, target in SOURCE.imports(module, nodes) for m in parents(target)}


def top_level(tree: ast.Module) -> list[ast.stmt]:
    """A module's statements outside its functions and classes."""
    return [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def closure(modules: set[str]) -> set[str]:
    """modules and every package module they import, anywhere in their files (lazy imports
    inside functions run when the code runs), except inside the functions of the
    :func:`registries`: a subcommand runs its own handler only (:func:`handler_modules`)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += loads(module)
    return seen


@cache
def loads(module: str) -> frozenset[str]:
    """The package modules a module loads itself (:func:`closure`'s arrows)."""
    if SOURCE.module_file(module) is None:
        return frozenset()
    tree = SOURCE.tree(module)
    return frozenset(imports_in(module, top_level(tree) if module in registries() else [tree])
                     | dynamic_imports(module, tree))


def dynamic_imports(module: str, tree: ast.Module) -> set[str]:
    """Package modules a module may load by name rather than by an import statement: every
    module a string names (``"hwgptbench.predictors.mlp"``, ``"module:function"``), and every
    submodule of a package that imports ``f"{__name__}.{...}"`` (the search algorithms)."""
    found = {target for _, target in SOURCE.named(module)}
    if SOURCE.is_package(module) and any(_imports_by_name(node) for node in ast.walk(tree)):
        folder = SOURCE.file(module).parent
        found |= {f"{module}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    return found


def _imports_by_name(node: ast.AST) -> bool:
    """An f-string starting with ``__name__``: a submodule named at run time."""
    return (isinstance(node, ast.JoinedStr) and bool(node.values)
            and isinstance(node.values[0], ast.FormattedValue)
            and getattr(node.values[0].value, "id", None) == "__name__")


def bound_modules(module: str, nodes: Iterable[ast.AST]) -> dict[str, str]:
    """Local names that ``from`` imports under nodes bind to package modules
    (``from . import stage`` binds ``stage``)."""
    bound: dict[str, str] = {}
    for node in nodes:
        for child in ast.walk(node):
            if isinstance(child, ast.ImportFrom):
                base = SOURCE.from_base(module, child)
                bound |= {alias.asname or alias.name: f"{base}.{alias.name}"
                          for alias in child.names if SOURCE.module_file(f"{base}.{alias.name}")}
    return bound


@cache
def handler(subcommand: str) -> tuple[str, str]:
    """(module, function) of a subcommand's handler, from the command line's parser."""
    from .. import cli  # the assembler; imported only here, to read its parser

    parser = cli.build_parser(subcommand)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    func = commands.choices[subcommand].get_default("func")
    return func.__module__, func.__name__


def functions_of(module: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in SOURCE.tree(module).body if isinstance(n, ast.FunctionDef)}


def _called(module: str, function: ast.FunctionDef, bound: dict[str, str]
            ) -> list[tuple[str, str]]:
    """The (module, function) pairs a function calls: by name in its module, or as
    ``module.function(...)`` of a registry."""
    found = []
    for call in ast.walk(function):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Name):
            found.append((module, call.func.id))
        elif (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
              and bound.get(call.func.value.id) in registries()):
            found.append((bound[call.func.value.id], call.func.attr))
    return found


@cache
def handler_functions(subcommand: str) -> frozenset[tuple[str, str]]:
    """The (module, function) pairs a CLI subcommand runs: its handler and the functions it
    calls, in its module or in a registry or stage module through ``module.function(...)``."""
    visited: set[tuple[str, str]] = set()
    todo = [handler(subcommand)]
    while todo:
        module, name = todo.pop()
        functions = functions_of(module)
        if (module, name) in visited or name not in functions:
            continue
        visited.add((module, name))
        bound = bound_modules(module, top_level(SOURCE.tree(module)) + [functions[name]])
        todo += _called(module, functions[name], bound)
    return frozenset(visited)


@cache
def handler_modules(subcommand: str) -> frozenset[str]:
    """The package modules a CLI subcommand runs: the modules of :func:`handler_functions` and
    their parent packages (imported first), the module-level imports of those modules, the
    imports inside those functions, and their closure."""
    direct: set[str] = set()
    for module, name in handler_functions(subcommand):
        direct |= imports_in(module, [*top_level(SOURCE.tree(module)), functions_of(module)[name]])
    followed = {module for module, _ in handler_functions(subcommand)}
    parents = {m.rsplit(".", i)[0] for m in followed for i in range(1, m.count(".") + 1)}
    return frozenset(followed | closure((direct | parents) - followed))
