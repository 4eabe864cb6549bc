"""dvc.yaml's dependencies are the code each stage runs (docs/workflow.md).

For every DVC stage, Snakemake's dry run of its target (``--forceall``, so the whole chain of
jobs; one dry run for all stages) gives the ``hwgptbench`` subcommands that its rules run. The
import closure of each subcommand's handler inside the package, with the modules that the
Snakefile itself imports, is the code the stage runs. Every module of that closure must be
covered by a ``deps`` entry of the stage or of a stage upstream of it, or `dvc status` would
call the stage up to date after a change to code that changes its results. The same for
params: the params.yaml sections that a stage's rules read (the
``results/.params/{section}.json`` files they take as input) must be in the ``params:`` of the
stage or of an upstream stage.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from conftest import REPO_ROOT
from hwgptbench import cli
from hwgptbench.settings import sections as settings_sections

T = TypeVar("T")
PACKAGE = "hwgptbench"
SRC = REPO_ROOT / "src"
SUBCOMMAND = re.compile(r"\bhwgptbench ([a-z][a-z0-9-]*)")
# modules whose functions import lazily what only some callers use: the registries of
# subcommands, `cli.py` and every stage package's `commands.py` (each handler imports its
# stage), and the stage modules with one function per subcommand; the code a subcommand runs
# is followed into them function by function (:func:`handler_modules`)
REGISTRIES = {f"{PACKAGE}.cli", f"{PACKAGE}.commands", f"{PACKAGE}.compress.stage", *(
    f"{PACKAGE}.{path.parent.name}.commands" for path in SRC.glob(f"{PACKAGE}/*/commands.py"))}
NAMED_MODULE = re.compile(rf"{PACKAGE}(\.\w+)+(:\w+)?")
PARAMS_FILE = re.compile(r"results/\.params/([A-Za-z0-9_.]+)\.json")
# the paper's own search settings: paper.search written as the section `search` that the
# search commands read (workflow/rules/paper.smk); DVC tracks it as params `paper`
PAPER_FILE = re.compile(r"results/\.params/paper/([A-Za-z0-9_.]+)\.json")


def module_file(module: str) -> Path | None:
    """The source file of a package module, or None when it is not one."""
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _resolved(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Package modules an import statement inside ``module`` loads (parents included)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            is_package = module_file(module).name == "__init__.py"  # type: ignore[union-attr]
            parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        exports = lazy_exports_of(base)
        names = [base] + [f"{base}.{exports.get(alias.name, alias.name)}" for alias in node.names]
    found = set()
    for name in names:
        parts = name.split(".")
        if parts[0] != PACKAGE:
            continue
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
            return {k.value: v.value for k, v in zip(node.args[1].keys, node.args[1].values,
                                                     strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _typing_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports never run."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def imports_in(module: str, nodes: Iterable[ast.AST]) -> set[str]:
    """Package modules imported by the import statements found under nodes (those of
    ``if TYPE_CHECKING:`` blocks aside)."""
    found: set[str] = set()
    todo = [n for n in nodes if not _typing_only(n)]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _resolved(module, node)
        todo += [child for child in ast.iter_child_nodes(node) if not _typing_only(child)]
    return found


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    return [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def closure(modules: set[str]) -> set[str]:
    """modules and every package module they import, anywhere in their files (lazy imports
    inside functions run when the code runs), except inside the functions of the command
    registries: a subcommand runs its own handler only (:func:`handler_modules`)."""
    seen, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        if path is not None:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            todo += imports_in(module, _top_level(tree) if module in REGISTRIES else [tree])
            todo += dynamic_imports(module, tree)
    return seen


def dynamic_imports(module: str, tree: ast.Module) -> set[str]:
    """Package modules a module may load by name rather than by an import statement: every
    submodule of a package that imports ``f"{__name__}.{...}"`` (the search algorithms), and
    every module a string names (``"hwgptbench.predictors.mlp"``, ``"module:function"``: the
    surrogate families, a metric's meter). tests/test_workflow.py checks the closure against
    the modules the workflow's commands really load (their import traces)."""
    found: set[str] = {
        node.value.partition(":")[0] for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and NAMED_MODULE.fullmatch(node.value) and module_file(node.value.partition(":")[0])}
    is_package = module_file(module).name == "__init__.py"  # type: ignore[union-attr]
    for node in ast.walk(tree):
        if (is_package and isinstance(node, ast.JoinedStr) and node.values
                and isinstance(node.values[0], ast.FormattedValue)
                and getattr(node.values[0].value, "id", None) == "__name__"):
            folder = module_file(module).parent  # type: ignore[union-attr]
            found |= {f"{module}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    return found


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(module_file(module).read_text(encoding="utf-8"))  # type: ignore[union-attr]


def _bound_modules(module: str, nodes: Iterable[ast.AST]) -> dict[str, str]:
    """Local names that import statements under nodes bind to package modules
    (``from . import stage`` binds ``stage``)."""
    bound = {}
    for node in nodes:
        for child in ast.walk(node):
            if isinstance(child, ast.ImportFrom):
                base = _from_base(module, child)
                bound |= {alias.asname or alias.name: f"{base}.{alias.name}"
                          for alias in child.names if module_file(f"{base}.{alias.name}")}
    return bound


@cache
def handler_functions(subcommand: str) -> frozenset[tuple[str, str]]:
    """The (module, function) pairs a CLI subcommand runs: its handler and the functions it
    calls, in its module or in a registry or stage module through ``module.function(...)``."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    func = commands.choices[subcommand].get_default("func")
    visited: set[tuple[str, str]] = set()
    todo = [(func.__module__, func.__name__)]
    while todo:
        module, name = todo.pop()
        tree = _tree(module)
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        if (module, name) in visited or name not in functions:
            continue
        visited.add((module, name))
        bound = _bound_modules(module, _top_level(tree) + [functions[name]])
        for call in ast.walk(functions[name]):
            if not isinstance(call, ast.Call):
                continue
            if isinstance(call.func, ast.Name):
                todo.append((module, call.func.id))
            elif (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                  and bound.get(call.func.value.id) in REGISTRIES):
                todo.append((bound[call.func.value.id], call.func.attr))
    return frozenset(visited)


def _function(module: str, name: str) -> ast.FunctionDef:
    return next(n for n in _tree(module).body if isinstance(n, ast.FunctionDef) and n.name == name)


@cache
def handler_modules(subcommand: str) -> frozenset[str]:
    """The package modules a CLI subcommand runs: the modules of :func:`handler_functions` and
    their parent packages (imported first), the module-level imports of those modules, the
    imports inside those functions, and their closure."""
    direct: set[str] = set()
    for module, name in handler_functions(subcommand):
        direct |= imports_in(module, [*_top_level(_tree(module)), _function(module, name)])
    followed = {module for module, _ in handler_functions(subcommand)}
    parents = {m.rsplit(".", i)[0] for m in followed for i in range(1, m.count(".") + 1)}
    return frozenset(followed | closure((direct | parents) - followed))


@cache
def handler_reads(subcommand: str) -> frozenset[str]:
    """The params sections (``compress.X`` entries for the compress commands) a subcommand
    loads: the literal section lists of the ``load(args, [...])`` and ``merge_files(..., [...])``
    calls in the functions it runs, and the ``SECTION`` of each settings type it builds with
    ``load_settings(args, Type)``."""
    from hwgptbench.compress.commands import READS

    sections: set[str] = set()
    for module, name in handler_functions(subcommand):
        for call in ast.walk(_function(module, name)):
            if not isinstance(call, ast.Call) or len(call.args) != 2:
                continue
            called = getattr(call.func, "id", getattr(call.func, "attr", None))
            if called in ("load", "merge_files") and isinstance(call.args[1], ast.List):
                sections |= {e.value for e in call.args[1].elts if isinstance(e, ast.Constant)}
            elif called == "load_settings" and isinstance(call.args[1], ast.Name):
                sections.add(getattr(settings_sections, call.args[1].id).SECTION)
    if subcommand in READS:
        sections = (sections - {"compress"}) | {f"compress.{e}" for e in READS[subcommand]}
    return frozenset(sections)


def stage_modules(text: str) -> set[str]:
    """The package modules that jobs (their shell commands and inputs, as text) load: the
    Snakefile's, the command line's and each subcommand's handler's."""
    modules = set(workflow_modules()) | closure({f"{PACKAGE}.cli"})
    for subcommand in sorted(set(SUBCOMMAND.findall(text))):
        modules |= handler_modules(subcommand)
    return modules


@cache
def workflow_modules() -> frozenset[str]:
    """Package modules the Snakefile and its rules import (they run for every stage)."""
    found: set[str] = set()
    for path in [REPO_ROOT / "workflow" / "Snakefile",
                 *sorted((REPO_ROOT / "workflow" / "rules").glob("*.smk"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if stripped.startswith(("from hwgptbench", "import hwgptbench")):
                found |= _resolved(PACKAGE, ast.parse(stripped).body[0])  # type: ignore[arg-type]
    return frozenset(closure(found))


@dataclass
class Stage:
    """One expanded DVC stage: its target, deps and params entries, and its upstream stages."""

    name: str
    target: str
    deps: list[str]
    params: set[str]
    outs: list[str]


def dvc_stages() -> list[Stage]:
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    stages = []
    with Repo(str(REPO_ROOT)) as repo:
        for stage in repo.index.stages:
            deps = [str(Path(d.def_path)) for d in stage.deps
                    if not isinstance(d, ParamsDependency)]
            params = {key for d in stage.deps if isinstance(d, ParamsDependency)
                      for key in d.params}
            target = stage.cmd.split()[-1]
            stages.append(Stage(stage.addressing, target, deps, params,
                                [str(Path(o.def_path)) for o in stage.outs]))
    return stages


def reachable(start: list[T], needs: Callable[[T], list[T]]) -> list[T]:
    """start and everything that needs(...) leads to from it, transitively."""
    found: list[T] = []
    todo = list(start)
    while todo:
        item = todo.pop()
        if item not in found:
            found.append(item)
            todo += needs(item)
    return found


def upstream(stage: Stage, stages: list[Stage]) -> list[Stage]:
    """stage and every stage whose outputs it depends on, transitively."""
    return reachable([stage], lambda current: [
        s for s in stages if any(_under(d, o) for d in current.deps for o in s.outs)])


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass
class Job:
    """One job of Snakemake's dry run: its rule, input and output paths and shell command."""

    rule: str
    inputs: list[str]
    outputs: list[str]
    shell: str = ""


def dry_run(targets: list[str]) -> list[Job]:
    """Every job that makes the targets (``--forceall``: the whole chains), from one dry run."""
    result = subprocess.run(
        [shutil.which("snakemake") or "snakemake", "-n", "-p", "--forceall", *targets],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    jobs: list[Job] = []
    for line in (result.stdout + result.stderr).splitlines():
        if match := re.match(r"(?:local)?rule (\w+):$", line):
            jobs.append(Job(match[1], [], []))
        elif jobs and (match := re.match(r"    (input|output): (.*)$", line)):
            getattr(jobs[-1], f"{match[1]}s").extend(match[2].split(", "))
        elif jobs and line.startswith("Shell command: "):
            jobs[-1].shell = line
    return jobs


def _overlap(a: str, b: str) -> bool:
    return _under(a, b) or _under(b, a)


def chain(target: str, jobs: list[Job]) -> list[Job]:
    """The jobs that make target (a path or a rule name) and every job they need."""
    roots = [j for j in jobs if j.rule == target or any(_overlap(target, o) for o in j.outputs)]
    return reachable(roots, lambda job: [
        j for j in jobs if any(_overlap(i, o) for i in job.inputs for o in j.outputs)])


def uncovered(stage: Stage, stages: list[Stage], modules: set[str]) -> list[str]:
    """Files of modules that no deps entry of the stage or of an upstream stage covers."""
    covering = [d for s in upstream(stage, stages) for d in s.deps]
    files = {str(module_file(m).relative_to(REPO_ROOT)) for m in modules}  # type: ignore[union-attr]
    return sorted(f for f in files if not any(_under(f, d) for d in covering))


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dvc_stages()


@pytest.fixture(scope="module")
def jobs(stages: list[Stage]) -> list[Job]:
    return dry_run(sorted({s.target for s in stages}))


def problems(stage: Stage, stages: list[Stage], jobs: list[Job]) -> list[str]:
    """What the stage runs (code) and reads (params) that dvc.yaml does not make it depend
    on, each with the line to add, and the code it depends on but never loads."""
    needed = chain(stage.target, jobs)
    assert needed, f"stage {stage.name}: no Snakemake job makes {stage.target}"
    text = "\n".join(j.shell + " " + " ".join(j.inputs) for j in needed)
    modules = stage_modules(text)
    found = [f"stage {stage.name}: runs {path}; add `- {path}` to its deps in dvc.yaml (or to "
             "a stage upstream of it)" for path in uncovered(stage, stages, modules)]
    files = {str(module_file(m).relative_to(REPO_ROOT)) for m in modules}  # type: ignore[union-attr]
    found += [f"stage {stage.name}: depends on {dep}, which none of its jobs loads; remove it "
              "from its deps in dvc.yaml" for dep in stage.deps
              if dep.startswith(f"src/{PACKAGE}") and not any(_under(f, dep) for f in files)]
    declared = {p for s in upstream(stage, stages) for p in s.params}
    read = set(PARAMS_FILE.findall(text)) | ({"paper"} if PAPER_FILE.search(text) else set())
    return found + [f"stage {stage.name}: reads params {section}; add `- {section}` to its "
                    "params in dvc.yaml" for section in sorted(read)
                    if not any(section == p or section.startswith(p + ".") for p in declared)]


def params_problems(job: Job) -> list[str]:
    """Where a job's params files (``results/.params/{section}.json`` inputs) and the sections
    its subcommands load disagree: a section loaded but not passed, or passed but not read."""
    inputs = " ".join(job.inputs)
    passed = set(PARAMS_FILE.findall(inputs)) | set(PAPER_FILE.findall(inputs))
    reads: set[str] = set()
    for subcommand in set(SUBCOMMAND.findall(job.shell)):
        reads |= handler_reads(subcommand)
    if not reads:
        return []
    found = [f"rule {job.rule}: its command reads params {s}; add its file to the rule's params "
             "inputs" for s in sorted(reads)
             if not any(p == s or p.startswith(s + ".") for p in passed)]
    return found + [f"rule {job.rule}: passes params {p}, which its command never reads; "
                    "remove it" for p in sorted(passed)
                    if not any(p == s or p.startswith(s + ".") for s in reads)]


@pytest.mark.e2e
def test_every_rule_passes_the_params_its_command_reads(jobs: list[Job]) -> None:
    """What each rule gives its command (its params inputs) is what the command's code loads,
    derived from the code, so neither list is kept by hand."""
    found = sorted({problem for job in jobs for problem in params_problems(job)})
    assert not found, "\n".join(found)
    dense = next(j for j in jobs if j.rule == "compress_dense")
    short = Job(dense.rule, [i for i in dense.inputs if "allow_pickle_weights" not in i],
                dense.outputs, dense.shell)
    assert params_problems(short) == [
        "rule compress_dense: its command reads params compress.allow_pickle_weights; add its "
        "file to the rule's params inputs"]


@pytest.mark.e2e
def test_every_stage_depends_on_the_code_and_params_it_runs(stages: list[Stage],
                                                             jobs: list[Job]) -> None:
    found = [problem for stage in stages for problem in problems(stage, stages, jobs)]
    assert not found, "\n".join(found)


@pytest.mark.e2e
def test_a_missing_module_or_params_section_is_named(stages: list[Stage], jobs: list[Job]
                                                     ) -> None:
    """The check itself, on a copy of the stages with one code and one params dependency
    removed."""
    name = next(s.name for s in stages if s.name.startswith("surrogates"))
    copy = [Stage(s.name, s.target, [d for d in s.deps
                                    if d != "src/hwgptbench/predictors/fitting.py"],
                  s.params - {"surrogate"}, s.outs) for s in stages]
    stage = next(s for s in copy if s.name == name)
    found = problems(stage, copy, jobs)
    assert (f"stage {name}: runs src/hwgptbench/predictors/fitting.py; add "
            "`- src/hwgptbench/predictors/fitting.py` to its deps in dvc.yaml (or to a stage "
            "upstream of it)") in found
    assert found[-1] == (f"stage {name}: reads params surrogate; add `- surrogate` to its "
                         "params in dvc.yaml")
    assert not [line for line in found if "surrogate/commands.py" in line]
    # a stage's dependency on code that none of its jobs loads is named too
    extra = [Stage(s.name, s.target, [*s.deps, "src/hwgptbench/export/pt2.py"]
                   if s.name == "data" else s.deps, s.params, s.outs) for s in stages]
    assert problems(next(s for s in extra if s.name == "data"), extra, jobs) == [
        "stage data: depends on src/hwgptbench/export/pt2.py, which none of its jobs loads; "
        "remove it from its deps in dvc.yaml"]


def test_package_code_imports_lazy_names_from_their_modules() -> None:
    """A package that exports names lazily (``lazy_exports`` or a module ``__getattr__``)
    hides the module behind a name from the closure above, so package code imports the
    module itself: ``from ..moo.runner import run``, not ``from ..moo import run``."""
    lazy = {module: _defined_names(module) for module in _package_modules()
            if module_file(module).name == "__init__.py"  # type: ignore[union-attr]
            and "__getattr__" in module_file(module).read_text()}  # type: ignore[union-attr]
    assert {PACKAGE, f"{PACKAGE}.moo"} <= set(lazy)  # the scan finds them
    found = []
    for module in sorted(_package_modules()):
        tree = ast.parse(module_file(module).read_text())  # type: ignore[union-attr]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not _typing_only(node):
                base = _from_base(module, node)
                found += [f"{module}: imports {alias.name} from {base}" for alias in node.names
                          if base in lazy and alias.name not in lazy[base]
                          and module_file(f"{base}.{alias.name}") is None]
    assert not found, "\n".join(found)


def _from_base(module: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` inside ``module`` imports from."""
    if not node.level:
        return node.module or ""
    is_package = module_file(module).name == "__init__.py"  # type: ignore[union-attr]
    parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join(parts + ([node.module] if node.module else []))


def _defined_names(module: str) -> set[str]:
    """Names a module defines at its top level (not lazily)."""
    tree = ast.parse(module_file(module).read_text())  # type: ignore[union-attr]
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names - {"__getattr__"}


def _package_modules() -> set[str]:
    """Every module of the package, by dotted name."""
    return {".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
            for path in (SRC / PACKAGE).rglob("*.py")}


def test_plots_follow_the_configured_scales() -> None:
    """The top-level plots name their scale through workflow.scales, not a literal one."""
    plots = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["plots"]
    paths = [path for plot in plots for spec in plot.values() for path in spec["y"]]
    assert paths and all(p.startswith("results/${workflow.scales[0]}/") for p in paths), paths
