"""dvc.yaml's code deps, written from the code each stage runs (``hwgptbench dvc-deps``).

One Snakemake dry run of every DVC stage's target (``--forceall``: the whole chain of jobs)
gives each stage's jobs. A stage needs the files of the modules its jobs load (the Snakefile's,
``cli.py``'s and each ``hwgptbench`` subcommand's, :mod:`.code_closure`), ``workflow/Snakefile``
with the rule files that define no rule (parsed for every job), and the rule file of each of
its jobs' rules. Its generated code deps are those files less what its hand-written deps or
those of a stage upstream of it (by data deps) already cover: each file sorted, a folder of
the package in place of its files where every file under it is a needed ``.py`` file (the
outermost such folder). A ``foreach`` stage lists the union over its items.

The deps blocks are rewritten as text: comments, templates (``${item}``) and the
hand-written deps (data, ``devices``, ``workflow/report``, a package folder holding data
such as ``src/hwgptbench/published``) stay as they are; the code entries are replaced, in
place of the first of them.
"""

from __future__ import annotations

import ast
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

from ..errors import UserError
from ..io import atomic_write_text
from .code_closure import PACKAGE, SOURCE, SRC, closure, handler_modules, resolved

T = TypeVar("T")
log = logging.getLogger("hwgptbench")
DVC_FILES = ("dvc.yaml", "paper/dvc.yaml")
CODE = f"src/{PACKAGE}"
SUBCOMMAND = re.compile(rf"\b{PACKAGE} ([a-z][a-z0-9-]*)")
RULE = re.compile(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):", re.MULTILINE)
ENTRY = re.compile(r"^(\s*)- (\S+)(\s+#.*)?$")
FIX = "run `make deps` (hwgptbench dvc-deps) to rewrite them"


def repo_root(cwd: Path | None = None) -> Path:
    """The project folder: the current one, which must hold dvc.yaml and the source of the
    imported package (the paths written are relative to it)."""
    root = (cwd or Path.cwd()).resolve()
    if not (root / "dvc.yaml").is_file():
        raise UserError(f"{root}: no dvc.yaml here; run it in the project's root folder")
    if (root / CODE).resolve() != (SRC / PACKAGE).resolve():
        raise UserError(f"{root}: the {PACKAGE} imported is {SRC / PACKAGE}, not this "
                        f"project's {CODE}; install this one (pip install -e .)")
    return root


@dataclass
class Stage:
    """One expanded DVC stage: its dvc.yaml, name, target and deps, params and outs."""

    file: str
    name: str
    target: str
    deps: list[str]
    params: set[str]
    outs: list[str]

    @property
    def base(self) -> str:
        """The stage's name in its dvc.yaml (a ``foreach`` stage's, without ``@item``)."""
        return self.name.partition("@")[0]


def dvc_stages(root: Path) -> list[Stage]:
    """Every stage of the project's dvc.yaml files, as DVC expands them."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    stages = []
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            deps = [str(Path(d.def_path)) for d in stage.deps
                    if not isinstance(d, ParamsDependency)]
            params = {key for d in stage.deps if isinstance(d, ParamsDependency)
                      for key in d.params}
            file = Path(stage.dvcfile.path).resolve().relative_to(root).as_posix()
            stages.append(Stage(file, stage.name, stage.cmd.split()[-1], deps, params,
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


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def overlap(a: str, b: str) -> bool:
    return under(a, b) or under(b, a)


def upstream(stage: Stage, stages: list[Stage]) -> list[Stage]:
    """stage and every stage whose outputs it depends on, transitively."""
    return reachable([stage], lambda current: [
        s for s in stages if any(under(d, o) for d in current.deps for o in s.outs)])


@dataclass
class Job:
    """One job of Snakemake's dry run: its rule, input and output paths and shell command."""

    rule: str
    inputs: list[str]
    outputs: list[str]
    shell: str = ""


def dry_run(root: Path, targets: list[str]) -> list[Job]:
    """Every job that makes the targets (``--forceall``: the whole chains), from one dry run."""
    result = subprocess.run(
        [shutil.which("snakemake") or "snakemake", "-n", "-p", "--forceall", *targets],
        cwd=root, capture_output=True, text=True, check=False)
    if result.returncode:
        raise UserError(f"snakemake's dry run of {' '.join(targets)} failed:\n"
                        f"{result.stderr[-2000:]}")
    return parse_dry_run(result.stdout + result.stderr)


def parse_dry_run(output: str) -> list[Job]:
    """The jobs of ``snakemake -n -p`` output."""
    jobs: list[Job] = []
    for line in output.splitlines():
        if match := re.match(r"(?:local)?(?:rule|checkpoint) (\w+):$", line):
            jobs.append(Job(match[1], [], []))
        elif jobs and (match := re.match(r"    (input|output): (.*)$", line)):
            getattr(jobs[-1], f"{match[1]}s").extend(match[2].split(", "))
        elif jobs and line.startswith("Shell command: "):
            jobs[-1].shell = line
    return jobs


def chain(target: str, jobs: list[Job]) -> list[Job]:
    """The jobs that make target (a path or a rule name) and every job they need."""
    roots = [j for j in jobs if j.rule == target or any(overlap(target, o) for o in j.outputs)]
    return reachable(roots, lambda job: [
        j for j in jobs if any(overlap(i, o) for i in job.inputs for o in j.outputs)])


def jobs_text(jobs: Iterable[Job]) -> str:
    """The jobs' shell commands and inputs, as text to find subcommands and params files in."""
    return "\n".join(j.shell + " " + " ".join(j.inputs) for j in jobs)


def workflow_files(root: Path) -> list[Path]:
    return [root / "workflow" / "Snakefile",
            *sorted((root / "workflow" / "rules").glob("*.smk"))]


@cache
def workflow_modules(root: Path) -> frozenset[str]:
    """Package modules the Snakefile and its rules import (they run for every job)."""
    found: set[str] = set()
    for path in workflow_files(root):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith((f"from {PACKAGE}", f"import {PACKAGE}")):
                node = ast.parse(line.strip()).body[0]
                assert isinstance(node, (ast.Import, ast.ImportFrom))
                found |= resolved(PACKAGE, node)
    return frozenset(closure(found))


def stage_modules(root: Path, text: str) -> set[str]:
    """The package modules that jobs (their shell commands and inputs, as text) load: the
    Snakefile's, the command line's and each subcommand's handler's."""
    modules = set(workflow_modules(root)) | closure({f"{PACKAGE}.cli"})
    for subcommand in sorted(set(SUBCOMMAND.findall(text))):
        modules |= handler_modules(subcommand)
    return modules


@cache
def rule_files(root: Path) -> dict[str, str]:
    """Rule name -> the workflow file that defines it."""
    return {name: path.relative_to(root).as_posix() for path in workflow_files(root)
            for name in RULE.findall(path.read_text(encoding="utf-8"))}


def shared_files(root: Path) -> set[str]:
    """The Snakefile and the rule files that define no rule: parsed for every job."""
    return {path.relative_to(root).as_posix() for path in workflow_files(root)
            if path.name == "Snakefile" or not RULE.search(path.read_text(encoding="utf-8"))}


def module_path(module: str) -> str:
    """A package module's file, relative to the project folder."""
    return f"src/{SOURCE.file(module).relative_to(SRC).as_posix()}"


def stage_needs(root: Path, stage: Stage, jobs: list[Job]) -> set[str]:
    """The code files a stage's jobs run: their modules, the shared workflow files and the
    rule file of each of its jobs."""
    needed = chain(stage.target, jobs)
    if not needed:
        raise UserError(f"{stage.file}: stage {stage.name}: no Snakemake job makes "
                        f"{stage.target}")
    files = {module_path(m) for m in stage_modules(root, jobs_text(needed))}
    rules = rule_files(root)
    return files | shared_files(root) | {rules[j.rule] for j in needed if j.rule in rules}


def is_code(root: Path, entry: str) -> bool:
    """A deps entry that the generator owns: workflow/Snakefile, a rule file, a package
    module, or a package folder that holds nothing but ``.py`` files (or is gone)."""
    if entry == "workflow/Snakefile" or re.fullmatch(r"workflow/rules/[^/]+\.smk", entry):
        return True
    if not entry.startswith(CODE + "/"):
        return False
    path = root / entry
    return entry.endswith(".py") or not path.exists() or (
        path.is_dir() and all(p.suffix == ".py" for p in folder_files(path)))


def folder_files(folder: Path) -> list[Path]:
    """The files under a folder, Python's byte-code caches aside."""
    return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def collapse(root: Path, files: set[str]) -> list[str]:
    """files, sorted, the outermost package folder whose every file is a listed ``.py`` file
    in place of its files."""
    listed = set(files)
    folders = {str(Path(f).parents[i]) for f in files if f.startswith(CODE + "/")
               for i in range(len(Path(f).relative_to(CODE).parts) - 1)}
    for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
        contents = {p.relative_to(root).as_posix() for p in folder_files(root / folder)}
        if contents and all(c.endswith(".py") for c in contents) and contents <= listed:
            listed = {f for f in listed if not under(f, folder)} | {folder}
    return sorted(listed)


def generated_deps(root: Path, stages: list[Stage], jobs: list[Job]
                   ) -> dict[str, dict[str, list[str]]]:
    """dvc.yaml file -> stage -> its generated code deps (see the module's docstring)."""
    needs = {s.name: stage_needs(root, s, jobs) for s in stages}
    own: dict[tuple[str, str], set[str]] = {}
    for stage in stages:
        above = [s for s in upstream(stage, stages) if s is not stage]
        covering = [d for s in [*above, stage] for d in s.deps if not is_code(root, d)]
        covering += [f for s in above for f in needs[s.name]]
        own.setdefault((stage.file, stage.base), set()).update(
            f for f in needs[stage.name] if not any(under(f, c) for c in covering))
    found: dict[str, dict[str, list[str]]] = {}
    for (file, base), files in own.items():
        found.setdefault(file, {})[base] = collapse(root, files)
    return found


def deps_blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Stage name -> (index of its ``deps:`` line, index after its last item) in a dvc.yaml's
    lines: the items are the lines under ``deps:`` indented deeper, up to a blank line."""
    blocks: dict[str, tuple[int, int]] = {}
    stage, in_stages = None, False
    for i, line in enumerate(lines):
        if re.match(r"[^\s#]", line):
            in_stages, stage = line.startswith("stages:"), None
        elif in_stages and (match := re.match(r"  ([\w-]+):", line)):
            stage = match[1]
        elif stage and stage not in blocks and (match := re.match(r"(\s+)deps:\s*(#.*)?$", line)):
            end = i + 1
            while end < len(lines) and lines[end].strip() and (
                    len(lines[end]) - len(lines[end].lstrip()) > len(match[1])):
                end += 1
            blocks[stage] = (i, end)
    return blocks


def code_entries(lines: list[str], owned: Callable[[str], bool]) -> list[str]:
    """The deps entries of lines that the generator owns, in their order."""
    return [m[2] for line in lines if (m := ENTRY.match(line)) and owned(m[2])]


def rewritten_block(lines: list[str], wanted: list[str], owned: Callable[[str], bool]
                    ) -> list[str]:
    """A deps block's item lines with its code entries replaced by wanted, in place of the
    first of them (a kept entry keeps its line and trailing comment)."""
    items = [m for line in lines if (m := ENTRY.match(line))]
    indent = items[0][1] if items else "    "
    before = {m[2]: m[0] for m in items if owned(m[2])}
    new_lines = [before.get(path, f"{indent}- {path}") for path in wanted]
    kept: list[str] = []
    for line in lines:
        if (m := ENTRY.match(line)) and owned(m[2]):
            kept += new_lines
            new_lines = []
        else:
            kept.append(line)
    return kept + new_lines


def rewrite(text: str, wanted: Mapping[str, list[str]], owned: Callable[[str], bool],
            file: str = "dvc.yaml") -> str:
    """A dvc.yaml's text with the code deps of each stage in wanted replaced."""
    lines = text.splitlines()
    blocks = deps_blocks(lines)
    for stage in sorted(wanted, key=lambda s: -blocks.get(s, (-1, 0))[0]):
        if stage not in blocks:
            raise UserError(f"{file}: stage {stage} has no `deps:` list to write its code in")
        start, end = blocks[stage]
        block = rewritten_block(lines[start + 1:end], wanted[stage], owned)
        lines[start:end] = [lines[start], *block] if block else []
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def differences(text: str, wanted: Mapping[str, list[str]], owned: Callable[[str], bool],
                file: str = "dvc.yaml") -> dict[str, str]:
    """Stage -> what differs between the code deps a dvc.yaml lists and wanted, for each stage
    where they differ."""
    lines = text.splitlines()
    blocks = deps_blocks(lines)
    found = {stage: "it has no `deps:` list" for stage in wanted if stage not in blocks}
    for stage, (start, end) in blocks.items():
        current = code_entries(lines[start + 1:end], owned)
        if stage in wanted and current != wanted[stage]:
            found[stage] = describe(current, wanted[stage])
    return found


def describe(current: list[str], wanted: list[str]) -> str:
    """What differs between a stage's code deps and the generated ones."""
    missing = [p for p in wanted if p not in current]
    extra = [p for p in current if p not in wanted]
    parts = [f"should list {', '.join(missing)}"] if missing else []
    parts += [f"should not list {', '.join(extra)}"] if extra else []
    return f"its code deps differ from the code it runs ({'; '.join(parts) or 'out of order'})"


def generate(root: Path) -> dict[str, dict[str, list[str]]]:
    """dvc.yaml file -> stage -> the code deps it should list, from one dry run."""
    stages = dvc_stages(root)
    jobs = dry_run(root, sorted({s.target for s in stages}))
    return generated_deps(root, stages, jobs)


def update(root: Path, wanted: Mapping[str, Mapping[str, list[str]]], check: bool
           ) -> list[str]:
    """Each stage whose code deps differ, as ``file: stage X: what``; without check, the
    dvc.yaml files rewritten first (each atomically, once all are ready)."""
    def owned(entry: str) -> bool:
        return is_code(root, entry)

    found, texts = [], {}
    for file in DVC_FILES:
        if (root / file).exists():
            text = (root / file).read_text(encoding="utf-8")
            found += [f"{file}: stage {stage}: {what}" for stage, what
                      in differences(text, wanted.get(file, {}), owned, file).items()]
            texts[file] = (text, rewrite(text, wanted.get(file, {}), owned, file))
    for file, (old, new) in texts.items():
        if new != old and not check:
            atomic_write_text(root / file, new)
    return found


def main(check: bool, cwd: Path | None = None) -> list[str]:
    """``hwgptbench dvc-deps``: rewrite the stages' code deps (or, with check, only name the
    stages whose deps differ, each with the fix); returns those stages' lines."""
    root = repo_root(cwd)
    found = update(root, generate(root), check)
    if not found:
        log.info("%s: every stage's code deps are the code it runs", ", ".join(DVC_FILES))
    elif check:
        return [f"{line}; {FIX}" for line in found]
    for line in found:
        log.info("rewrote the code deps of %s", line)
    return found
