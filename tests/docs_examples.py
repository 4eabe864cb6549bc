"""The code examples of README.md and docs/*.md and how they run (tests/test_docs_examples.py;
the examples that need a finished run: tests/test_workflow.py): each fenced ```bash / ```sh and
```python block, extracted with mktestdocs (``grab_code_blocks``).

The blocks of one section of a document (the text under one heading) run in order, in one
scratch folder and, for Python, in one namespace, as a reader follows the section: a Python
block may use the names an earlier Python block of its section defined, and a command may read
what an earlier one wrote.

Where they run: a git clone of a scratch copy of the project (``conftest.make_project``) whose
``results/`` holds the shipped tables' surrogates, fitted once per test run (the
``published_s`` fixture, copied): what `make install` leaves, and nothing is written into the
repository. Python blocks run in this process with that folder as the working directory. A bash
block runs under ``bash -e -u -o pipefail``, with this interpreter's console scripts first on
PATH and the clone's ``src/`` on PYTHONPATH (so ``ship-tables`` writes the clone's package); a
block of plain commands only (no shell syntax but ``&&``) runs its ``hwgptbench`` and ``dvc``
commands in this process instead (``cli.main``, ``dvc.cli.main``), which saves each their
imports (seconds), and the others as subprocesses.

Where else a block runs is said by an HTML comment on the line right before its fence:

    <!-- test: e2e -->               needs a finished tiny run (`make run`, or `make pull`):
                                      runs in tests/test_workflow.py, in a copy of its pulled run
    <!-- test: slow (why) -->        takes minutes: ``pytest -m slow``
    <!-- test: gpu (why) -->         needs a CUDA device: ``pytest -m gpu``
    <!-- test: e2e, slow (why) -->   both
    <!-- test: skip (why) -->        cannot run in a test (a SLURM cluster, a real cloud
                                      remote, the network): the reason is the skip message

No marker: the default suite (`make test`). What a test runs differently from the document is
written in the tables below: SUBSTITUTIONS (a cheaper or local variant of a command), GIVEN (the
input files a reader brings), PRELUDE (what the prose before a block says was done) and CHECKS
(numbers a document quotes that its block's output gives).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mktestdocs import grab_code_blocks

from conftest import BIN, REPO_ROOT, free_port, limit, tool_env

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
MARKER = re.compile(r"<!--\s*test:\s*([a-z0-9, ]+?)\s*(?:\((.+)\))?\s*-->")
KINDS = {"e2e", "slow", "gpu", "skip"}
NEEDS_REASON = {"slow", "gpu", "skip"}
VENV = Path(sys.prefix)


@dataclass(frozen=True)
class Example:
    """One code block of a document."""

    doc: str  # relative to the repository: README.md, docs/guide.md
    line: int  # of the opening fence
    lang: str  # bash or python
    section: str  # the heading above it
    kinds: frozenset[str]  # its marker's kinds; empty: the default suite
    reason: str
    code: str

    @property
    def where(self) -> str:
        """default, slow, gpu, skip, e2e or e2e-slow."""
        if "skip" in self.kinds:
            return "skip"
        if "e2e" in self.kinds:
            return "e2e-slow" if "slow" in self.kinds else "e2e"
        return "gpu" if "gpu" in self.kinds else "slow" if "slow" in self.kinds else "default"


def fences(text: str) -> list[tuple[int, str, str, str]]:
    """(line, info string, section, the line before) of each fenced block, found as
    mktestdocs finds them (a line holding ``` opens or closes one)."""
    found, section, inside = [], "", False
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if "```" in line:
            if not inside:
                before = lines[number - 2].strip() if number > 1 else ""
                found.append((number, line.strip()[3:].strip(), section, before))
            inside = not inside
        elif not inside and line.startswith("#"):
            section = line.lstrip("#").strip()
    return found


def parse(path: Path) -> tuple[list[Example], list[str]]:
    """The runnable examples of a document, and the problems of its markers."""
    text = path.read_text()
    blocks = grab_code_blocks(text, lang=None)
    found = fences(text)
    doc = path.relative_to(REPO_ROOT).as_posix()
    assert len(blocks) == len(found), f"{doc}: an unclosed fence or an empty block"
    examples, problems = [], []
    for (line, info, section, before), code in zip(found, blocks, strict=True):
        lang = LANGUAGES.get(info.split()[0] if info else "")
        marker = MARKER.fullmatch(before)
        if marker is None and "test:" in before:
            problems.append(f"{doc}:{line}: unreadable marker {before!r}")
        if marker and lang is None:
            problems.append(f"{doc}:{line}: a marker before a block that is no code ({info!r})")
        if lang is None:
            continue
        kinds = frozenset(k.strip() for k in marker[1].split(",")) if marker else frozenset()
        reason = (marker[2] or "").strip() if marker else ""
        if kinds - KINDS:
            problems.append(f"{doc}:{line}: unknown marker kinds {sorted(kinds - KINDS)}")
        if kinds & NEEDS_REASON and not reason:
            problems.append(f"{doc}:{line}: {sorted(kinds & NEEDS_REASON)} needs its reason")
        examples.append(Example(doc, line, lang, section, kinds, reason, code))
    return examples, problems


def all_examples() -> list[Example]:
    return [example for path in DOCS for example in parse(path)[0]]


@dataclass(frozen=True)
class Group:
    """The examples of one section that run in the same place, in order."""

    doc: str
    section: str
    where: str
    examples: tuple[Example, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.examples[0].line}"


def groups(where: set[str]) -> list[Group]:
    """The examples grouped by document, section and where they run."""
    grouped: dict[tuple[str, str, str], list[Example]] = {}
    for example in all_examples():
        if example.where in where:
            grouped.setdefault((example.doc, example.section, example.where), []).append(example)
    return [Group(doc, section, kind, tuple(examples))
            for (doc, section, kind), examples in grouped.items()]


# --- what a test runs differently from the document ----------------------------------------


@dataclass(frozen=True)
class Substitution:
    """``old`` becomes ``new`` in every example of ``doc`` (``*``: every document) before it
    runs, or only in those that run on the finished test run (``e2e_only``); ``new`` may name
    {venv} (this environment), {port} (a free local port) and {tmp} (a scratch folder)."""

    doc: str
    old: str
    new: str
    why: str
    e2e_only: bool = False

    def applies(self, example: Example) -> bool:
        return (self.doc in ("*", example.doc)
                and (not self.e2e_only or example.where.startswith("e2e")))


INSTALLED = "the test extra installs the extra already; a test never installs"
MAKE = ("the test's environment stands for .venv (VENV), which make must not install into "
        "(-o: .installed is taken as up to date)")
TEST_RUN = "params/test.yaml's run"
SUBSTITUTIONS = [
    Substitution("*", "source .venv/bin/activate", ":",
                 "this interpreter's console scripts are first on PATH"),
    Substitution("*", ".venv/bin/", "", "the same"),
    Substitution("*", "pip install -e '.[cluster]'", "python -c 'import snakemake_executor_"
                 "plugin_slurm'", INSTALLED),
    Substitution("*", "pip install -e '.[s3]'", "python -c 'import dvc_s3'", INSTALLED),
    Substitution("docs/transfer.md", "git clone <this repository> hwgptbench && cd hwgptbench "
                 "&& make install", ":", "the scratch clone is that clone, installed"),
    Substitution("*", "make paper", "make paper VENV={venv} -o {venv}/.installed", MAKE),
    Substitution("*", "make pull", "make pull VENV={venv} -o {venv}/.installed", MAKE),
    Substitution("*", "make hwgptbench", "make -n hwgptbench",
                 "the network (its dvc import from GitHub) and 30+ min of measuring: the "
                 "recipe is printed, and the plan is the block's own dry run"),
    Substitution("*", 'git commit -m "results"', 'git commit --allow-empty -m "results"',
                 "the finished run's dvc.lock is committed already"),
    Substitution("docs/remotes.md", "5000", "{port}", "a free local port for moto's server"),
    Substitution("*", "/tmp/", "{tmp}/", "the test's scratch folder: nothing outside it"),
    # params/test.yaml, the finished run that the e2e examples read: 6 archs, 3 supernet
    # steps, runtime in fp32 without recomputation
    Substitution("*", "--k 10", "--k 3", TEST_RUN + ": 6 archs", e2e_only=True),
    Substitution("*", '"dtype": "bf16"', '"dtype": "fp32"', TEST_RUN + ": runtime in fp32",
                 e2e_only=True),
    Substitution("*", "b1-t64-fp32-eager-train-recompute", "b1-t64-fp32-eager-train",
                 TEST_RUN + ": no recomputation", e2e_only=True),
    Substitution("docs/guide.md", "compute_reference(problem, 100_000", "compute_reference("
                 "problem, 2_000", "10^5 archs take minutes", e2e_only=True),
    Substitution("docs/guide.md", '"nsga2", budget=100', '"nsga2", budget=20',
                 "the same, for 100 evaluations", e2e_only=True),
    Substitution("*", "--metric memory_peak_mb", "--metric flops",
                 TEST_RUN + ": no memory measured", e2e_only=True),
    Substitution("*", "--nproc_per_node 4", "--nproc_per_node 2",
                 TEST_RUN + ": a global batch of 2", e2e_only=True),
    # the studies and campaigns (slow, gpu): the same commands on fewer archs or seconds
    Substitution("docs/measure.md", "--archs 100", "--archs 3", "100 archs take 30+ min"),
    Substitution("docs/paper_scale.md", '--out "$OUT" --seconds 420', "--out .gpu/loan1 "
                 "--seconds 60", "$OUT came back from the GPU machine as .gpu/loan1; a minute"),
    Substitution("docs/paper_scale.md", "--rows .gpu/loan1 .gpu/loan2", "--rows .gpu/loan1",
                 "the one loan above"),
    Substitution("docs/paper_scale.md", '--out "$OUT" --seconds 150', "--out .gpu/loan3 "
                 "--seconds 60", "the same, for the second loan"),
]


def tiny_archs(folder: Path) -> None:
    """my_archs.txt: three archs of the run's tiny table."""
    import polars as pl

    archs = pl.read_parquet(folder / "results" / "tiny" / "archs.parquet")["arch_id"]
    (folder / "my_archs.txt").write_text("\n".join(archs[:3]) + "\n")


def l_archs(folder: Path) -> None:
    """my_archs.txt: three archs of the shipped l table."""
    from hwgptbench import published

    (folder / "my_archs.txt").write_text(
        "\n".join(published.perplexity_table("l")["arch_id"][:3]) + "\n")


def measured_elsewhere(folder: Path) -> Callable[[], None]:
    """The run's measurements filed under another label: a new device adapts from the
    results it pulled, which other machines measured (here the run measured this one).
    Undone after the section."""
    import polars as pl

    path = folder / "results" / "tiny" / "measurements.parquet"
    original = path.read_bytes()
    pl.read_parquet(path).with_columns(device=pl.lit("another-machine")).write_parquet(path)
    return lambda: path.write_bytes(original)


def phone_table(folder: Path) -> None:
    """phone.parquet: another device's measured rows (the run's own, relabeled)."""
    import polars as pl

    rows = pl.read_parquet(folder / "results" / "tiny" / "measurements.parquet")
    first = rows["device"][0]
    rows.filter(pl.col("device") == first).with_columns(device=pl.lit("my-phone")).write_parquet(
        folder / "phone.parquet")


def s_measure_inputs(folder: Path) -> None:
    """my_params.yaml (params.yaml with params/hwgptbench.yaml over it, as the doc says) and
    archs.parquet: two archs of the shipped CPU table."""
    import polars as pl
    import yaml

    from hwgptbench import published
    from hwgptbench.params import overlay

    merged = overlay(yaml.safe_load((folder / "params.yaml").read_text()),
                     yaml.safe_load((folder / "params" / "hwgptbench.yaml").read_text()))
    (folder / "my_params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    table = published.device_tables("s")["cpu-amd-epyc-1t"]
    pl.DataFrame({"arch_id": table["arch_id"].unique(maintain_order=True)[:2]}).write_parquet(
        folder / "archs.parquet")


# (document, a line of the block): the input files a reader brings, written before it runs
# (a function that changes a file of the run returns what undoes it after the section)
GIVEN: dict[tuple[str, str], Callable[[Path], Callable[[], None] | None]] = {
    ("docs/guide.md", "--scale l --metric perplexity"): l_archs,
    ("docs/guide.md", "--out predictions.csv"): tiny_archs,
    ("docs/guide.md", "hwgptbench adapt --scale tiny --device auto"): measured_elsewhere,
    ("docs/transfer.md", "hwgptbench adapt --scale tiny --device auto"): measured_elsewhere,
    ("docs/transfer.md", "--measurements phone.parquet"): phone_table,
    ("docs/paper_scale.md", "--params my_params.yaml"): s_measure_inputs,
}
# (document, a line of the block): shell commands run first, for what the prose says was done
PRELUDE = {
    ("docs/remotes.md", "profile hwgptbench"):  # the remote of "An S3 bucket", above
        "dvc remote add s3 s3://my-bucket/hwgptbench",
    ("docs/remotes.md", "make pull REMOTE=s3"):  # a second remote, named s3: the local folder
        'dvc remote add --local s3 "$(dvc config remote.local.url)"\n'
        "dvc remote modify --local s3 verify true",
}


def paper_plan_count(doc: str, output: str) -> str | None:
    """guide.md quotes the job count of the paper's plan, as `snakemake -n` counts it."""
    total = re.search(r"^total\s+(\d+)$", output, re.MULTILINE)
    assert total, output[-2000:]
    jobs = f"{int(total[1]):,}"
    quoted = re.search(r"its full plan \(([\d,]+) jobs\)", " ".join(doc.split()))
    if quoted is None or quoted[1] != jobs:
        return f"docs/guide.md: the paper's plan has {jobs} jobs, the text says {quoted}"
    return None


# (document, a line of the block): a check of the block's output against its document
CHECKS: dict[tuple[str, str], Callable[[str, str], str | None]] = {
    ("docs/guide.md", "--configfile params/paper.yaml -n"): paper_plan_count,
}


def matching(table: dict[tuple[str, str], object], example: Example) -> list[object]:
    return [value for (doc, line), value in table.items()
            if doc == example.doc and line in example.code]


def substituted(example: Example, values: dict[str, str]) -> str:
    code = example.code
    for sub in SUBSTITUTIONS:
        if sub.applies(example):
            code = code.replace(sub.old, sub.new.format(**values))
    return code


# --- running ------------------------------------------------------------------------------

SHELL_SYNTAX = re.compile(r"[$|;<>`(){}*?\[\]~\\]|(?<!&)&(?!&)")
IN_PROCESS = {"query", "devices", "measure-plan", "evaluate", "status"}


def plain_commands(code: str) -> list[list[str]] | None:
    """The commands of a block of plain commands (``&&`` splits one line), or None where the
    block uses any other shell syntax."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if SHELL_SYNTAX.search(line.split(" #")[0]) or "=" in words[0]:
            return None
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def runs_in_process(argv: list[str]) -> bool:
    if argv[0] == "dvc":
        return True
    if argv[0] != "hwgptbench" or len(argv) < 2:
        return False
    return argv[1] in IN_PROCESS or (argv[1] == "adapt" and "--measurements" in argv)


def run_plain(commands: list[list[str]], folder: Path, env: dict[str, str],
              monkeypatch: pytest.MonkeyPatch, baseline_s: float) -> str:
    """Run plain commands one by one; the output of those run as subprocesses."""
    output = []
    for argv in commands:
        if argv[0] in (":", "true"):
            continue
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                env[name] = value
                monkeypatch.setenv(name, value)
            continue
        if runs_in_process(argv):
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                if argv[0] == "dvc":
                    from dvc.cli import main as dvc_main

                    code = dvc_main(argv[1:])
                else:
                    from hwgptbench import cli

                    code = cli.main(argv[1:])
            output.append(sink.getvalue())
            assert code == 0, f"{shlex.join(argv)} exited {code}\n{sink.getvalue()[-3000:]}"
            continue
        program = sys.executable if argv[0] in ("python", "python3") else argv[0]
        result = subprocess.run([program, *argv[1:]], cwd=folder, env=env, text=True,
                                capture_output=True, timeout=limit(baseline_s))
        output.append(result.stdout + result.stderr)
        assert result.returncode == 0, (f"{shlex.join(argv)} exited {result.returncode}\n"
                                        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return "".join(output)


def run_bash(code: str, folder: Path, env: dict[str, str], baseline_s: float) -> str:
    script = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + code
    result = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-c", script], cwd=folder,
                            env=env, text=True, capture_output=True, timeout=limit(baseline_s))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"exited {result.returncode}\n{output[-6000:]}"
    return output


def example_env(folder: Path) -> dict[str, str]:
    env = tool_env()
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(folder / "src")
    env["EDITOR"] = "cat"  # ${EDITOR:-nano} FILE shows the file instead of editing it
    return env


def run_example(example: Example, folder: Path, env: dict[str, str],
                namespace: dict[str, object], monkeypatch: pytest.MonkeyPatch,
                baseline_s: float) -> None:
    scratch = folder / "tmp"
    scratch.mkdir(exist_ok=True)
    code = substituted(example, {"venv": str(VENV), "port": str(free_port()),
                                 "tmp": str(scratch)})
    try:
        for prelude in matching(PRELUDE, example):
            run_bash(str(prelude), folder, env, baseline_s)
        if example.lang == "python":
            exec(compile(code, f"{example.doc}:{example.line}", "exec"), namespace)
            return
        commands = plain_commands(code)
        if commands is not None:
            output = run_plain(commands, folder, env, monkeypatch, baseline_s)
        else:
            output = run_bash(code, folder, env, baseline_s)
    except Exception as exc:
        raise AssertionError(f"{example.doc}:{example.line} ({example.section}) failed: "
                             f"{exc}\n--- it ran:\n{code}") from exc
    for check in matching(CHECKS, example):
        problem = check((REPO_ROOT / example.doc).read_text(), output)  # type: ignore
        assert problem is None, problem


def run_group(group: Group, folder: Path, monkeypatch: pytest.MonkeyPatch,
              baseline_s: float = 200) -> None:
    """Run a group's examples in order in ``folder`` (a failure names the block and shows
    the code that ran), then undo what its GIVEN functions changed."""
    monkeypatch.chdir(folder)
    env = example_env(folder)
    namespace: dict[str, object] = {"__name__": "__main__"}
    undo = []
    try:
        for example in group.examples:
            for given in matching(GIVEN, example):
                undo.append(given(folder))  # type: ignore[operator]
            run_example(example, folder, env, namespace, monkeypatch, baseline_s)
    finally:
        for step in reversed(undo):
            if step is not None:
                step()


def params(where: set[str]) -> list[object]:
    """The groups that run ``where``, as pytest parameters with their markers."""
    long = pytest.mark.timeout(3600)  # `make paper` takes 13 min on 2 cores, more when busy
    marks = {"slow": [pytest.mark.slow, long], "e2e-slow": [pytest.mark.slow, long],
             "gpu": [pytest.mark.gpu, long]}
    return [pytest.param(group, id=group.id, marks=marks.get(group.where, []))
            for group in groups(where)]


KEPT = {Path(".git"), Path(".dvc", "cache")}  # commits stay; the cache is the original's


def restore(copy: Path, original: Path) -> None:
    """Make ``copy`` (a copy of ``original`` made with its modification times) hold what
    ``original`` holds again, git's folder and DVC's cache aside: what a section added is
    removed, what it changed or removed is copied back."""
    def walk(root: Path) -> tuple[dict[Path, tuple[int, int]], set[Path]]:
        files, folders = {}, set()
        for folder, dirs, names in os.walk(root):
            here = Path(folder).relative_to(root)
            dirs[:] = [d for d in dirs if here / d not in KEPT]
            folders.update(here / d for d in dirs)
            for name in names:
                stat = (root / here / name).lstat()
                files[here / name] = (stat.st_size, stat.st_mtime_ns)
        return files, folders

    (now, now_folders), (then, then_folders) = walk(copy), walk(original)
    for path in now.keys() - then.keys():
        (copy / path).unlink()
    for path, stamp in then.items():
        if now.get(path) != stamp:
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            (copy / path).unlink(missing_ok=True)
            shutil.copy2(original / path, copy / path, follow_symlinks=False)
    for path in sorted(now_folders - then_folders, reverse=True):
        shutil.rmtree(copy / path, ignore_errors=True)
