"""The stages' deps and the rules' code listings, written from what they run (``make deps``).

DVC reruns a stage only when its own deps change, so a stage lists everything its own jobs run
and read, whatever an upstream stage lists. One Snakemake dry run of every DVC stage's target
(``--forceall``) gives each stage's own jobs: those that make its target, short of the jobs
that make one of its data deps (an upstream stage's). A stage needs the files of the modules
its jobs load (the Snakefile's, ``cli.py``'s and each ``hwgptbench`` subcommand's,
:mod:`.code_closure`), the data of their packages (the files in a package's folder that are no
Python source) and the package files they name in ``PACKAGE_FILES``, the Snakefile with every
file it includes, the package files those name by path, and Snakemake's default profile. Its
generated deps are those files less what its hand-written deps cover, sorted, a folder in place
of its files where every file under it is listed (the outermost such folder). A ``foreach``
stage lists the union over its items.

The deps blocks are rewritten as text: comments, templates (``${item}``) and the hand-written
deps (data, ``devices``, ``workflow/report``) stay as they are; the generated entries are
replaced, in place of the first of them. Each rule that runs a command also gets its code
listing, ``workflow/code/{rule}.txt``, which the Snakefile fingerprints (:mod:`.fingerprints`).
"""

from __future__ import annotations

import ast
import logging
import os
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
from ..outputs import remove_file
from .code_closure import PACKAGE, SOURCE, SRC, closure, handler_modules, resolved
from .fingerprints import PLANNING_ENV, folder_files

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
        cwd=root, capture_output=True, text=True, check=False,
        env={**os.environ, PLANNING_ENV: "1"})
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


def own_jobs(stage: Stage, jobs: list[Job]) -> list[Job]:
    """The jobs a stage runs: those that make its target and every job they need, short of
    the jobs that make one of the stage's deps (an upstream stage makes those)."""
    def upstream(job: Job) -> bool:
        return any(overlap(o, d) for o in job.outputs for d in stage.deps)

    roots = [j for j in jobs
             if j.rule == stage.target or any(overlap(stage.target, o) for o in j.outputs)]
    return reachable([j for j in roots if not upstream(j)], lambda job: [
        j for j in jobs if not upstream(j)
        and any(overlap(i, o) for i in job.inputs for o in j.outputs)])


def jobs_text(jobs: Iterable[Job]) -> str:
    """The jobs' shell commands and inputs, as text to find subcommands and params files in."""
    return "\n".join(j.shell + " " + " ".join(j.inputs) for j in jobs)


INCLUDE = re.compile(r"^include:\s*[\"']([^\"']+)[\"']", re.MULTILINE)
WORKFLOW = "workflow"
SNAKEFILE = f"{WORKFLOW}/Snakefile"
RULE_CODE = f"{WORKFLOW}/code"  # one listing per rule: the files its commands load and read
PROFILE = f"{WORKFLOW}/profiles/default/config.yaml"  # Snakemake's settings when run here
DATA_NAME = "PACKAGE_FILES"  # a module's package files that it reads by path


@cache
def workflow_files(root: Path) -> tuple[Path, ...]:
    """The Snakefile and the files it includes: Snakemake parses them all for every job."""
    snakefile = root / SNAKEFILE
    included = INCLUDE.findall(snakefile.read_text(encoding="utf-8"))
    return (snakefile, *(snakefile.parent / name for name in included))


@cache
def workflow_data(root: Path) -> frozenset[str]:
    """The package files that the workflow files read by their path (a string naming a file
    under the package's source, such as the shipped tables' manifest)."""
    named = re.compile(rf"[\"']({CODE}/[^\"']+)[\"']")
    return frozenset(found for path in workflow_files(root)
                     for found in named.findall(path.read_text(encoding="utf-8"))
                     if (root / found).is_file())


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


def command_modules(text: str) -> set[str]:
    """The package modules that commands (shell lines, as text) load: the command line's and
    each subcommand's handler's."""
    modules = set(closure({f"{PACKAGE}.cli"}))
    for subcommand in sorted(set(SUBCOMMAND.findall(text))):
        modules |= handler_modules(subcommand)
    return modules


def stage_modules(root: Path, text: str) -> set[str]:
    """The package modules that jobs (their shell commands and inputs, as text) load: the
    Snakefile's, the command line's and each subcommand's handler's."""
    return set(workflow_modules(root)) | command_modules(text)


def module_path(module: str) -> str:
    """A package module's file, relative to the project folder."""
    return f"src/{SOURCE.file(module).relative_to(SRC).as_posix()}"


@cache
def package_data(root: Path, module: str) -> frozenset[str]:
    """The data a package reads: the files in its folder that are not Python source, and
    those in its sub-folders that are no package (a module reads nothing else)."""
    if not SOURCE.is_package(module):
        return frozenset()
    folder = root / Path(module_path(module)).parent
    found: set[str] = set()
    todo = [folder]
    while todo:
        current = todo.pop()
        for path in current.iterdir():
            if path.is_dir() and path.name != "__pycache__" and not (path / "__init__.py").exists():
                todo.append(path)
            elif path.is_file() and path.suffix not in (".py", ".pyc"):
                found.add(path.relative_to(root).as_posix())
    return frozenset(found)


@cache
def declared_data(root: Path, module: str) -> frozenset[str]:
    """The package files a module reads by path and names in its ``PACKAGE_FILES`` (a tuple of
    globs relative to the package, such as the sources a training checkpoint hashes)."""
    found: set[str] = set()
    for node in SOURCE.tree(module).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List))
                and any(getattr(t, "id", None) == DATA_NAME for t in node.targets)):
            for item in node.value.elts:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    found |= {p.relative_to(root).as_posix()
                              for p in (root / CODE).glob(item.value) if p.is_file()}
    return frozenset(found)


def code_files(root: Path, modules: Iterable[str]) -> set[str]:
    """The files of modules and the data they and their packages read."""
    modules = set(modules)
    return {module_path(m) for m in modules} | {
        f for m in modules for f in package_data(root, m) | declared_data(root, m)}


def rule_code(root: Path, jobs: list[Job]) -> dict[str, list[str]]:
    """Rule -> the files its commands load and read (its jobs' and its rule's text's
    ``hwgptbench`` subcommands), for each rule that runs one; folders stand for their files
    where exact."""
    texts: dict[str, str] = {}
    for path in workflow_files(root):
        text = path.read_text(encoding="utf-8")
        starts = [(m.start(), m[1]) for m in RULE.finditer(text)] + [(len(text), "")]
        for (start, rule), (end, _) in zip(starts, starts[1:], strict=False):
            texts[rule] = texts.get(rule, "") + text[start:end]
    for job in jobs:
        texts[job.rule] = texts.get(job.rule, "") + "\n" + job.shell
    return {rule: collapse(root, code_files(root, command_modules(text)))
            for rule, text in sorted(texts.items()) if SUBCOMMAND.search(text)}


def stage_needs(root: Path, stage: Stage, jobs: list[Job]) -> set[str]:
    """The files a stage runs and reads: the modules its jobs' commands and the Snakefile load
    with their packages' data, the Snakefile with every file it includes, the package files
    they read by path, and the profile it runs with (its ``cores`` are the jobs' threads).
    The rules' code listings are no input of a result: they stand for code listed here
    (:mod:`.fingerprints`)."""
    needed = own_jobs(stage, jobs)
    if not needed:
        raise UserError(f"{stage.file}: stage {stage.name}: no Snakemake job makes "
                        f"{stage.target}")
    workflow = {p.relative_to(root).as_posix() for p in workflow_files(root)} | {PROFILE}
    workflow |= workflow_data(root)
    return code_files(root, stage_modules(root, jobs_text(needed))) | workflow


def is_code(entry: str) -> bool:
    """A deps entry that the generator owns: the Snakefile, the default profile, a file or
    folder under ``workflow/rules``, or anything under the package's source."""
    return (entry in (SNAKEFILE, PROFILE) or entry.startswith(CODE + "/")
            or under(entry, f"{WORKFLOW}/rules"))


def collapse(root: Path, files: set[str]) -> list[str]:
    """files, sorted, the outermost folder (of the package, or ``workflow/rules``) whose every
    file is listed in place of its files."""
    listed = set(files)
    folders = {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parts) - 1)}
    for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
        if folder != f"{WORKFLOW}/rules" and not (under(folder, CODE) and folder != CODE):
            continue
        contents = {p.relative_to(root).as_posix() for p in folder_files(root / folder)}
        if contents and contents <= listed:
            listed = {f for f in listed if not under(f, folder)} | {folder}
    return sorted(listed)


def generated_deps(root: Path, stages: list[Stage], jobs: list[Job]
                   ) -> dict[str, dict[str, list[str]]]:
    """dvc.yaml file -> stage -> its generated deps (see the module's docstring)."""
    own: dict[tuple[str, str], set[str]] = {}
    for stage in stages:
        written = [d for d in stage.deps if not is_code(d)]
        own.setdefault((stage.file, stage.base), set()).update(
            f for f in stage_needs(root, stage, jobs) if not any(under(f, d) for d in written))
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


@dataclass
class Generated:
    """What ``make deps`` writes: each stage's deps (dvc.yaml file -> stage -> entries) and
    each rule's code listing (rule -> entries)."""

    deps: dict[str, dict[str, list[str]]]
    rules: dict[str, list[str]]


def generate(root: Path) -> Generated:
    """The deps each stage should list and each rule's code listing, from one dry run."""
    stages = dvc_stages(root)
    jobs = dry_run(root, sorted({s.target for s in stages}))
    return Generated(generated_deps(root, stages, jobs), rule_code(root, jobs))


def listing_text(rule: str, entries: list[str]) -> str:
    return (f"# rule {rule}: the files its commands load and read, written by `make deps`\n"
            + "".join(f"{entry}\n" for entry in entries))


def listings_update(root: Path, rules: Mapping[str, list[str]]
                    ) -> tuple[list[str], dict[Path, str | None]]:
    """What differs between workflow/code/ and the rules' listings (lines), and each file to
    write (its text) or delete (None)."""
    folder = root / RULE_CODE
    present = {p.stem: p for p in folder.glob("*.txt")} if folder.is_dir() else {}
    found: list[str] = []
    changes: dict[Path, str | None] = {}
    for rule, entries in rules.items():
        path, text = folder / f"{rule}.txt", listing_text(rule, entries)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            found.append(f"{RULE_CODE}/{rule}.txt: its entries differ from the code rule "
                         f"{rule} runs")
            changes[path] = text
    for rule in sorted(set(present) - set(rules)):
        found.append(f"{RULE_CODE}/{rule}.txt: no rule {rule} runs a command")
        changes[present[rule]] = None
    return found, changes


def update(root: Path, wanted: Generated, check: bool) -> list[str]:
    """Each stage whose deps differ, as ``file: stage X: what``, and each rule listing that
    differs; without check, the files rewritten first (each atomically, once all are
    ready)."""
    owned = is_code
    found, texts = [], {}
    for file in DVC_FILES:
        if (root / file).exists():
            text = (root / file).read_text(encoding="utf-8")
            found += [f"{file}: stage {stage}: {what}" for stage, what
                      in differences(text, wanted.deps.get(file, {}), owned, file).items()]
            texts[root / file] = rewrite(text, wanted.deps.get(file, {}), owned, file)
    listed, changes = listings_update(root, wanted.rules)
    found += listed
    if not check:
        for path, new in {**texts, **changes}.items():
            if new is None:  # the repository's generated files: dvc.yaml, code listings
                remove_file(path, owned=True)
            elif not path.is_file() or path.read_text(encoding="utf-8") != new:
                atomic_write_text(path, new, owned=True)
    return found


def main(check: bool, cwd: Path | None = None) -> list[str]:
    """``hwgptbench dvc-deps``: rewrite the stages' deps and the rules' code listings (or,
    with check, only name those that differ, each with the fix); returns their lines."""
    root = repo_root(cwd)
    found = update(root, generate(root), check)
    if not found:
        log.info("%s, %s/: every stage's deps and every rule's listing are the code it runs",
                 ", ".join(DVC_FILES), RULE_CODE)
    elif check:
        return [f"{line}; {FIX}" for line in found]
    for line in found:
        log.info("rewrote %s", line)
    return found
