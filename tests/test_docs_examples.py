"""Every code example of README.md and docs/*.md runs (tests/docs_examples.py: how, and the
marking convention): here those of the default suite and those marked slow, gpu or skip; those
that need a finished run (marked e2e) run in tests/test_workflow.py against its pulled run.

A test is one section of a document: its blocks run in order in one scratch clone, and its
Python blocks in one namespace, so a block may use what an earlier block of its section
defined or wrote."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import docs_examples
from conftest import make_project, tool_env
from docs_examples import (
    CHECKS,
    DOCS,
    GIVEN,
    PRELUDE,
    SUBSTITUTIONS,
    Group,
    all_examples,
    params,
    parse,
    run_group,
)


def test_markers_are_well_formed() -> None:
    """Every marker names known kinds and, where it keeps a block out of the default suite
    for a reason (slow, gpu, skip), says it; a marker stands before a code block."""
    assert [problem for path in DOCS for problem in parse(path)[1]] == []


def test_a_bad_marker_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A\n\n<!-- test: skip -->\n```bash\ntrue\n```\n<!-- test: e2e -->\n"
                    "```yaml\na: 1\n```\n<!-- test: later -->\n```python\npass\n```\n")
    monkeypatch.setattr(docs_examples, "REPO_ROOT", tmp_path)
    examples, problems = parse(page)
    assert [(e.line, e.lang, e.kinds) for e in examples] == [
        (4, "bash", frozenset({"skip"})), (12, "python", frozenset({"later"}))]
    assert problems == ["page.md:4: ['skip'] needs its reason",
                        "page.md:8: a marker before a block that is no code ('yaml')",
                        "page.md:12: unknown marker kinds ['later']"]


def test_every_table_entry_applies() -> None:
    """The tables name blocks that exist: a changed document never leaves an entry behind."""
    examples = all_examples()
    assert [sub for sub in SUBSTITUTIONS
            if not any(sub.applies(e) and sub.old in e.code for e in examples)] == []
    for table in (GIVEN, PRELUDE, CHECKS):
        assert [key for key in table
                if not any(e.doc == key[0] and key[1] in e.code for e in examples)] == []


def test_the_examples_are_found() -> None:
    """mktestdocs and the marker scan agree on every document, and find its blocks."""
    examples = all_examples()
    assert len(examples) >= 60
    assert {e.doc for e in examples} >= {"README.md", "docs/guide.md", "docs/transfer.md"}


@pytest.fixture(scope="module")
def base_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch copy of the project, cloned for each group."""
    return make_project(tmp_path_factory.mktemp("docs"))


def installed(base_project: Path, published_s: Path, tmp_path: Path) -> Path:
    """A clone of the project as `make install` leaves it, after its first query (the
    shipped tables' surrogates fitted under results/published/)."""
    folder = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(base_project), str(folder)], check=True,
                   env=tool_env(), capture_output=True)
    shutil.copytree(published_s, folder / "results", symlinks=True)
    return folder


@pytest.mark.parametrize("group", params({"default", "slow", "gpu", "skip"}))
def test_doc_examples(group: Group, request: pytest.FixtureRequest, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A section's examples, in order, in a clone as `make install` leaves it."""
    if group.where == "skip":
        pytest.skip("; ".join(dict.fromkeys(e.reason for e in group.examples)))
    folder = installed(request.getfixturevalue("base_project"),
                       request.getfixturevalue("published_s"), tmp_path)
    run_group(group, folder, monkeypatch, 900 if group.where in ("slow", "gpu") else 200)

