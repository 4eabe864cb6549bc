"""Declared = imported: pyproject.toml's dependencies (extras included) are exactly the
third-party distributions that src/, tests/ and benchmarks/ import, apart from a short,
commented list of tools and plugins that are needed without being imported."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Mapping
from functools import cache
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import REPO_ROOT

tomllib = pytest.importorskip("tomllib")

# Needed, never imported: command-line tools and plugins that their hosts load by name.
NOT_IMPORTED = {
    "snakemake": "the workflow engine, run as a command (Makefile, dvc.yaml, tests)",
    "pytest-timeout": "pytest plugin (pyproject's timeout)",
    "pytest-xdist": "pytest plugin (make test's -n)",
    "ruff": "the linter, run as a command by make test",
    "mypy": "the type checker, run as a command by tests/test_types.py",
    "dvc-s3": "DVC's S3 remote plugin (docs/remotes.md)",
    "moto": "its S3 server, started as a command by the remote tests",
    "snakemake-executor-plugin-slurm": "Snakemake's SLURM executor (workflow/profiles/slurm)",
}
# Imported by tests only, and brought by the declared distribution that the test exercises:
# declaring them too sends pip's resolver through hundreds of boto3 releases (an install of the
# test extra went from 1 min to over 5).
PROVIDED_BY = {"boto3": "moto", "botocore": "moto", "huggingface-hub": "transformers"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """Every distribution pyproject.toml declares, extras included."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"],
                    *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {normalized(Requirement(r).name) for r in requirements}


def imported_modules(*folders: Path) -> dict[str, set[str]]:
    """Top-level modules imported anywhere (functions included) in the folders' Python files
    that are neither the standard library, the package itself, nor a module or a folder of
    modules of the folders."""
    local = {p.stem for folder in folders for p in folder.rglob("*.py")} | {"hwgptbench"}
    local |= {p.parent.name for folder in folders for p in folder.rglob("*/*.py")}
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


@cache
def installed_modules() -> Mapping[str, list[str]]:
    """Top-level module -> the installed distributions providing it (a scan of every
    distribution's files: read once)."""
    return packages_distributions()


def distribution_of(module: str) -> str:
    """The installed distribution that provides a top-level module (its own name when none
    installed does, as for the optional extras that make test does not install)."""
    names = installed_modules().get(module)
    return normalized(names[0] if names else module)


def test_declared_dependencies_are_the_imported_ones() -> None:
    folders = [REPO_ROOT / "src", REPO_ROOT / "tests", REPO_ROOT / "benchmarks"]
    imports = {distribution_of(m): files for m, files in imported_modules(*folders).items()}
    wanted = declared()
    for provided, provider in PROVIDED_BY.items():
        assert normalized(provider) in wanted
        assert provided in {normalized(Requirement(r).name) for r in requires(provider) or []}
    undeclared = {d: sorted(files)[:3] for d, files in imports.items()
                  if d not in wanted and d not in PROVIDED_BY}
    assert not undeclared, f"imported but not in pyproject.toml: {undeclared}"
    unused = sorted(wanted - set(imports) - {normalized(n) for n in NOT_IMPORTED})
    assert not unused, (f"declared in pyproject.toml but imported nowhere: {unused}; remove "
                        "them, or list them with the reason in NOT_IMPORTED")
    stale = sorted({normalized(n) for n in NOT_IMPORTED} - wanted)
    assert not stale, f"NOT_IMPORTED names undeclared distributions: {stale}"


def test_the_lock_pins_every_declared_distribution() -> None:
    """requirements.lock (`make lock`) pins each declared distribution to one version, except
    torch (the Makefile's TORCH_SPEC) and the extra that make lock leaves out (torchao)."""
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            assert str(requirement.specifier).startswith("=="), line
            pins[normalized(requirement.name)] = str(requirement.specifier)
    missing = sorted(declared() - set(pins) - {"torch", "torchao"})
    assert not missing, f"not in requirements.lock: {missing}; run make lock"
    assert "torch" not in pins
