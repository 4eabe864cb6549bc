"""The workflow passes Snakemake's linter, except the one lint it keeps on purpose
(docs/workflow.md, "Linting the workflow"); ruff runs in `make test` itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import make_project, run

pytestmark = pytest.mark.e2e  # spawns snakemake or dvc

KEPT = "Specify a conda environment or container for each rule."


def test_snakemake_lint_finds_only_the_kept_lint(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    out = run(["snakemake", "--lint"], project, check=False)
    text = out.stdout + out.stderr
    lints = re.findall(r"^\s+\* (.+?):?$", text, flags=re.MULTILINE)
    assert lints, f"no lint parsed from snakemake --lint:\n{text}"
    assert {lint.rstrip(":") for lint in lints} == {KEPT.rstrip(":")}, text
