"""The package modules a subcommand runs, read from the source (AST), never imported.

A subcommand runs its handler and the functions it calls, followed function by function into
the command registries and stage modules; their imports (lazy ones inside functions included,
``if TYPE_CHECKING:`` blocks not), the submodule behind a lazily exported name, and the modules
loaded by name, closed over what those import.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PACKAGE = "hwgptbench"
SRC = Path(__file__).resolve().parents[2]  # the folder holding the package's source
NAMED_MODULE = re.compile(rf"{PACKAGE}(\.\w+)+(:\w+)?")


@cache
def registries() -> frozenset[str]:
    """Modules whose functions import lazily what only some callers use: ``cli.py``, the
    commands registries (each handler imports its stage) and ``compress/stage.py`` (one
    function per subcommand); a subcommand is followed into them function by function."""
    stages = {f"{PACKAGE}.{p.parent.name}.commands" for p in SRC.glob(f"{PACKAGE}/*/commands.py")}
    return frozenset({f"{PACKAGE}.cli", f"{PACKAGE}.commands", f"{PACKAGE}.compress.stage",
                      *stages})


def module_file(module: str) -> Path | None:
    """The source file of a package module, or None when it is not one."""
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def source_file(module: str) -> Path:
    """The source file of a package module (which must be one)."""
    path = module_file(module)
    if path is None:
        raise ValueError(f"{module} is no module of {PACKAGE}")
    return path


def is_package(module: str) -> bool:
    return source_file(module).name == "__init__.py"


def from_base(module: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` inside ``module`` imports from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts[: len(parts) - node.level + is_package(module)]
    return ".".join(parts + ([node.module] if node.module else []))


def resolved(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Package modules an import statement inside ``module`` loads (parents included)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = from_base(module, node)
        exports = lazy_exports_of(base)
        names = [base] + [f"{base}.{exports.get(alias.name, alias.name)}" for alias in node.names]
    found = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == PACKAGE:
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)
                      if module_file(".".join(parts[:i]))}
    return found


@cache
def lazy_exports_of(package: str) -> dict[str, str]:
    """The ``lazy_exports`` map of a package (name -> its submodule), empty for other modules:
    ``from package import name`` loads that submodule when the name is used."""
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Dict)):
            pairs = zip(node.args[1].keys, node.args[1].values, strict=True)
            return {k.value: v.value for k, v in pairs if isinstance(k, ast.Constant)
                    and isinstance(v, ast.Constant) and isinstance(k.value, str)
                    and isinstance(v.value, str)}
    return {}


def typing_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports never run."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def imports_in(module: str, nodes: Iterable[ast.AST]) -> set[str]:
    """Package modules imported by the import statements under nodes (those of
    ``if TYPE_CHECKING:`` blocks aside)."""
    found: set[str] = set()
    todo = [n for n in nodes if not typing_only(n)]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= resolved(module, node)
        todo += [child for child in ast.iter_child_nodes(node) if not typing_only(child)]
    return found


def top_level(tree: ast.Module) -> list[ast.stmt]:
    """A module's statements outside its functions and classes."""
    return [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]


@cache
def tree_of(module: str) -> ast.Module:
    return ast.parse(source_file(module).read_text(encoding="utf-8"))


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
    if module_file(module) is None:
        return frozenset()
    tree = tree_of(module)
    return frozenset(imports_in(module, top_level(tree) if module in registries() else [tree])
                     | dynamic_imports(module, tree))


def dynamic_imports(module: str, tree: ast.Module) -> set[str]:
    """Package modules a module may load by name rather than by an import statement: every
    module a string names (``"hwgptbench.predictors.mlp"``, ``"module:function"``), and every
    submodule of a package that imports ``f"{__name__}.{...}"`` (the search algorithms)."""
    found = {node.value.partition(":")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and NAMED_MODULE.fullmatch(node.value) and module_file(node.value.partition(":")[0])}
    if is_package(module) and any(_imports_by_name(node) for node in ast.walk(tree)):
        folder = source_file(module).parent
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
                base = from_base(module, child)
                bound |= {alias.asname or alias.name: f"{base}.{alias.name}"
                          for alias in child.names if module_file(f"{base}.{alias.name}")}
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
    return {n.name: n for n in tree_of(module).body if isinstance(n, ast.FunctionDef)}


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
        bound = bound_modules(module, top_level(tree_of(module)) + [functions[name]])
        todo += _called(module, functions[name], bound)
    return frozenset(visited)


@cache
def handler_modules(subcommand: str) -> frozenset[str]:
    """The package modules a CLI subcommand runs: the modules of :func:`handler_functions` and
    their parent packages (imported first), the module-level imports of those modules, the
    imports inside those functions, and their closure."""
    direct: set[str] = set()
    for module, name in handler_functions(subcommand):
        direct |= imports_in(module, [*top_level(tree_of(module)), functions_of(module)[name]])
    followed = {module for module, _ in handler_functions(subcommand)}
    parents = {m.rsplit(".", i)[0] for m in followed for i in range(1, m.count(".") + 1)}
    return frozenset(followed | closure((direct | parents) - followed))


def package_modules() -> set[str]:
    """Every module of the package, by dotted name."""
    return {".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
            for path in (SRC / PACKAGE).rglob("*.py")}
