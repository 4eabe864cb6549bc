"""dvc.yaml's dependencies are the code each stage runs (docs/workflow.md).

`hwgptbench dvc-deps` (`make deps`, :mod:`hwgptbench.pipeline.dvc_deps`) writes each stage's
code deps from one Snakemake dry run of every stage's target (``--forceall``): the import
closure of each ``hwgptbench`` subcommand's handler that the stage's own jobs run, with the
modules that the Snakefile itself imports (:mod:`hwgptbench.pipeline.code_closure`). Here the
files are checked to be what it writes, and independently of the writer: every module of that
closure must be covered by a ``deps`` entry of the stage itself, never by an upstream stage's
(DVC reruns a stage only when its own deps change), or `dvc status` would call the stage up
to date after a change to code that changes its results. The same for params: the
params.yaml sections that a stage's rules read (the ``results/.params/{section}.json`` files
they take as input) must be in the stage's own ``params:``. tests/test_workflow.py proves
both by mutation, against a trace of what each stage's processes really ran.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT
from hwgptbench import cli
from hwgptbench.pipeline import dvc_deps
from hwgptbench.pipeline.code_closure import (
    PACKAGE,
    SOURCE,
    SRC,
    functions_of,
    handler_functions,
    handler_modules,
)
from hwgptbench.pipeline.dvc_deps import (
    SUBCOMMAND,
    Job,
    Stage,
    dry_run,
    dvc_stages,
    jobs_text,
    own_jobs,
    stage_modules,
    under,
)
from hwgptbench.settings import sections as settings_sections

PARAMS_FILE = re.compile(r"results/\.params/([A-Za-z0-9_.]+)\.json")
# the paper's own search settings: paper.search written as the section `search` that the
# search commands read (workflow/rules/paper.smk); DVC tracks it as params `paper`
PAPER_FILE = re.compile(r"results/\.params/paper/([A-Za-z0-9_.]+)\.json")


def handler_reads(subcommand: str) -> frozenset[str]:
    """The params sections (``compress.X`` entries for the compress commands) a subcommand
    loads: the literal section lists of the ``load(args, [...])`` and ``merge_files(..., [...])``
    calls in the functions it runs, and the ``SECTION`` of each settings type it builds with
    ``load_settings(args, Type)``."""
    from hwgptbench.compress.commands import READS

    sections: set[str] = set()
    for module, name in handler_functions(subcommand):
        for call in ast.walk(functions_of(module)[name]):
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


def file_sections(subcommand: str) -> frozenset[str]:
    """The params sections that the modules a subcommand loads read from the workflow's
    section files by name (``params_sections(top) / "measure.json"``) rather than through
    ``--params``: a rule may pass such a file without the command loading it as params."""
    found: set[str] = set()
    for module in handler_modules(subcommand):
        for node in ast.walk(SOURCE.tree(module)):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                    and isinstance(node.right, ast.Constant) and isinstance(node.right.value, str)
                    and node.right.value.endswith(".json")
                    and any(getattr(c, "attr", getattr(c, "id", None)) == "params_sections"
                            for c in ast.walk(node.left))):
                found.add(node.right.value.removesuffix(".json"))
    return frozenset(found)


def repo_path(module: str) -> str:
    return SOURCE.file(module).relative_to(REPO_ROOT).as_posix()


def uncovered(stage: Stage, modules: set[str]) -> list[str]:
    """Files of modules that no deps entry of the stage itself covers."""
    files = {repo_path(m) for m in modules}
    return sorted(f for f in files if not any(under(f, d) for d in stage.deps))


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dvc_stages(REPO_ROOT)


@pytest.fixture(scope="module")
def jobs(stages: list[Stage]) -> list[Job]:
    return dry_run(REPO_ROOT, sorted({s.target for s in stages}))


def problems(stage: Stage, jobs: list[Job]) -> list[str]:
    """What the stage's own jobs run (code) and read (params) that dvc.yaml does not make it
    depend on, each with the line to add, and the code it depends on but never loads."""
    needed = own_jobs(stage, jobs)
    assert needed, f"stage {stage.name}: no Snakemake job makes {stage.target}"
    text = jobs_text(needed)
    modules = stage_modules(REPO_ROOT, text)
    found = [f"stage {stage.name}: runs {path}; add `- {path}` to its deps in dvc.yaml"
             for path in uncovered(stage, modules)]
    files = dvc_deps.code_files(REPO_ROOT, modules) | dvc_deps.workflow_data(REPO_ROOT)
    found += [f"stage {stage.name}: depends on {dep}, which none of its jobs loads; remove it "
              "from its deps in dvc.yaml" for dep in stage.deps
              if dep.startswith(f"src/{PACKAGE}") and not any(under(f, dep) for f in files)]
    declared = stage.params
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
    by_name: set[str] = set()
    for subcommand in set(SUBCOMMAND.findall(job.shell)):
        reads |= handler_reads(subcommand)
        by_name |= file_sections(subcommand)
    if not reads:
        return []
    found = [f"rule {job.rule}: its command reads params {s}; add its file to the rule's params "
             "inputs" for s in sorted(reads)
             if not any(p == s or p.startswith(s + ".") for p in passed)]
    return found + [f"rule {job.rule}: passes params {p}, which its command never reads; "
                    "remove it" for p in sorted(passed)
                    if not any(p == s or p.startswith(s + ".") for s in reads | by_name)]


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
    found = [problem for stage in stages for problem in problems(stage, jobs)]
    assert not found, "\n".join(found)


@pytest.mark.e2e
def test_a_missing_module_or_params_section_is_named(stages: list[Stage], jobs: list[Job]
                                                     ) -> None:
    """The check itself, on a copy of the stages with one code and one params dependency
    removed."""
    name = next(s.name for s in stages if s.name.startswith("surrogates"))
    fitting = "src/hwgptbench/predictors/fitting.py"
    copy = [Stage(s.file, s.name, s.target, [d for d in s.deps if not under(fitting, d)],
                  s.params - {"surrogate"}, s.outs) for s in stages]
    stage = next(s for s in copy if s.name == name)
    found = problems(stage, jobs)
    assert (f"stage {name}: runs src/hwgptbench/predictors/fitting.py; add "
            "`- src/hwgptbench/predictors/fitting.py` to its deps in dvc.yaml") in found
    assert found[-1] == (f"stage {name}: reads params surrogate; add `- surrogate` to its "
                         "params in dvc.yaml")
    assert not [line for line in found if "surrogate/commands.py" in line]
    # a stage's dependency on code that none of its jobs loads is named too
    extra = [Stage(s.file, s.name, s.target, [*s.deps, "src/hwgptbench/export/pt2.py"]
                   if s.name == "data" else s.deps, s.params, s.outs) for s in stages]
    assert problems(next(s for s in extra if s.name == "data"), jobs) == [
        "stage data: depends on src/hwgptbench/export/pt2.py, which none of its jobs loads; "
        "remove it from its deps in dvc.yaml"]


@pytest.mark.e2e
def test_every_job_that_runs_a_command_takes_its_rules_code_as_input(jobs: list[Job]) -> None:
    """Snakemake reruns a job when the code of its rule changes: its input is the rule's code
    fingerprint (workflow/code/{rule}.txt, hashed when the Snakefile is parsed)."""
    found = [f"rule {job.rule}: runs hwgptbench and takes no results/.code/{job.rule}.sha256; "
             f"add `code=code(\"{job.rule}\")` to its input" for job in jobs
             if SUBCOMMAND.search(job.shell) and f"results/.code/{job.rule}.sha256"
             not in job.inputs]
    assert not found, "\n".join(sorted(set(found)))


def test_package_code_imports_lazy_names_from_their_modules() -> None:
    """A package that exports names lazily (``lazy_exports`` or a module ``__getattr__``)
    hides the module behind a name from the closure above, so package code imports the
    module itself: ``from ..moo.runner import run``, not ``from ..moo import run``."""
    lazy = {module: _defined_names(module) for module in SOURCE.modules()
            if SOURCE.is_package(module) and "__getattr__" in SOURCE.file(module).read_text()}
    assert {PACKAGE, f"{PACKAGE}.moo"} <= set(lazy)  # the scan finds them
    found = []
    for module in sorted(SOURCE.modules()):
        for node in ast.walk(SOURCE.tree(module)):
            if isinstance(node, ast.ImportFrom):
                base = SOURCE.from_base(module, node)
                found += [f"{module}: imports {alias.name} from {base}" for alias in node.names
                          if base in lazy and alias.name not in lazy[base]
                          and SOURCE.module_file(f"{base}.{alias.name}") is None]
    assert not found, "\n".join(found)


def _defined_names(module: str) -> set[str]:
    """Names a module defines at its top level (not lazily)."""
    names = set()
    for node in SOURCE.tree(module).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names - {"__getattr__"}


def test_plots_follow_the_configured_scales() -> None:
    """The top-level plots name their scale through workflow.scales, not a literal one."""
    plots = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["plots"]
    paths = [path for plot in plots for spec in plot.values() for path in spec["y"]]
    assert paths and all(p.startswith("results/${workflow.scales[0]}/") for p in paths), paths


@pytest.mark.e2e
def test_dvc_yaml_files_hold_the_code_deps_that_make_deps_writes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`hwgptbench dvc-deps --check` (one DVC read and one Snakemake dry run) finds dvc.yaml and
    paper/dvc.yaml as `make deps` writes them."""
    monkeypatch.chdir(REPO_ROOT)
    assert cli.main(["dvc-deps", "--check"]) == 0, capsys.readouterr().err


SMALL = """\
# the header
stages:
  data:
    cmd: snakemake data
    deps:
      - data/corpora
      # what every command loads
      - src/hwgptbench/io.py
      - src/hwgptbench/gone.py    # a module since removed
      - workflow/Snakefile
    outs:
      - results/data
  train:
    foreach: ${workflow.scales}
    do:
      cmd: snakemake results/${item}/model.pt
      deps:
        - results/data
        - src/hwgptbench/model    # the whole package
        - devices
        - workflow/report
      outs:
        - results/${item}/model.pt
  plain:
    cmd: snakemake plain
    deps:
      - results/data
"""


def owned(entry: str) -> bool:
    return dvc_deps.is_code(entry)


def test_the_rewriter_replaces_code_deps_only() -> None:
    """Comments, templates and the hand-written deps (data, tables published from other
    machines, workflow/report) stay; the generated entries (the package's code and data, the
    workflow files) are replaced where the first of them was, a kept entry with its comment;
    a stage with no generated deps gets them after its others."""
    assert owned("src/hwgptbench/model") and owned("src/hwgptbench/gone.py")
    assert owned("src/hwgptbench/published") and owned("workflow/rules")
    assert not owned("devices") and not owned("workflow/report")
    wanted = {"data": ["src/hwgptbench/cli.py", "src/hwgptbench/io.py", "workflow/Snakefile"],
              "train": ["src/hwgptbench/model", "src/hwgptbench/space.py"],
              "plain": ["src/hwgptbench/layout.py"]}
    text = dvc_deps.rewrite(SMALL, wanted, owned)
    assert text == SMALL.replace(
        "      - src/hwgptbench/io.py\n      - src/hwgptbench/gone.py    # a module since "
        "removed\n", "      - src/hwgptbench/cli.py\n      - src/hwgptbench/io.py\n").replace(
        "        - src/hwgptbench/model    # the whole package\n",
        "        - src/hwgptbench/model    # the whole package\n"
        "        - src/hwgptbench/space.py\n").replace(
        "plain\n    deps:\n      - results/data\n",
        "plain\n    deps:\n      - results/data\n      - src/hwgptbench/layout.py\n")
    assert yaml.safe_load(text)["stages"]["train"]["do"]["deps"][:2] == [
        "results/data", "src/hwgptbench/model"]
    assert dvc_deps.rewrite(text, wanted, owned) == text
    assert dvc_deps.differences(text, wanted, owned) == {}
    assert dvc_deps.differences(SMALL, wanted, owned) == {
        "data": "its code deps differ from the code it runs (should list src/hwgptbench/cli.py;"
                " should not list src/hwgptbench/gone.py)",
        "train": "its code deps differ from the code it runs (should list "
                 "src/hwgptbench/space.py)",
        "plain": "its code deps differ from the code it runs (should list "
                 "src/hwgptbench/layout.py)"}


def test_a_folder_stands_for_its_files_only_when_every_one_is_needed() -> None:
    model = sorted(p.relative_to(REPO_ROOT).as_posix()
                   for p in (SRC / PACKAGE / "model").glob("*.py"))
    assert dvc_deps.collapse(REPO_ROOT, {*model, "src/hwgptbench/io.py"}) == [
        "src/hwgptbench/io.py", "src/hwgptbench/model"]
    assert dvc_deps.collapse(REPO_ROOT, set(model[1:])) == model[1:]


def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            wanted: dict[str, dict[str, list[str]]]) -> Path:
    """A project folder holding SMALL as its dvc.yaml (and this package's source), in which
    the generator finds the deps wanted."""
    (tmp_path / "src").symlink_to(REPO_ROOT / "src")
    (tmp_path / "dvc.yaml").write_text(SMALL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dvc_deps, "generate", lambda root: dvc_deps.Generated(wanted, {}))
    return tmp_path / "dvc.yaml"


def test_check_names_each_stage_whose_deps_differ_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    wanted = {"dvc.yaml": {"data": ["src/hwgptbench/io.py", "workflow/Snakefile"],
                           "train": ["src/hwgptbench/model"], "plain": []}}
    path = project(tmp_path, monkeypatch, wanted)
    assert cli.main(["dvc-deps", "--check"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "hwgptbench dvc-deps: error: dvc.yaml: stage data: its code deps differ from the code "
        "it runs (should not list src/hwgptbench/gone.py); run `make deps` (hwgptbench "
        "dvc-deps) to rewrite them"]
    assert path.read_text() == SMALL  # --check writes nothing
    assert cli.main(["dvc-deps"]) == 0
    assert "gone.py" not in path.read_text() and "# a module since removed" not in path.read_text()
    assert cli.main(["dvc-deps", "--check"]) == 0


def test_dvc_deps_runs_in_the_project_folder_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["dvc-deps", "--check"]) == 2
    assert "no dvc.yaml here; run it in the project's root folder" in capsys.readouterr().err
