"""The package's two layers: stages (one package per workflow stage) import foundations, never
another stage (they read other stages' outputs as files), and foundations import no stage. The
command line (``cli.py``) is the one module that assembles the stages."""

from __future__ import annotations

from pathlib import Path

import hwgptbench
from hwgptbench.pipeline.source_imports import PackageSource

PACKAGE = Path(hwgptbench.__file__).parent
# packages under the stages: what several stages use (docs/architecture.md)
# `pipeline` (dvc.yaml's code deps) is one too: it reads stages as source, never imports one,
# and the root commands.py runs it
FOUNDATIONS = {"model", "meters", "campaign", "training", "tokens", "evaluation", "predictors",
               "moo", "plotting", "published", "settings", "adaptation", "pipeline"}
ASSEMBLERS = {"cli.py"}  # imports every stage's `commands` to build the parser


def layer_violations(root: Path, foundations: set[str]) -> list[str]:
    """Every import that crosses the layers wrongly, as 'file:line: ... imports module': import
    statements anywhere in a file (function-level and typing ones included) and strings that
    name a module of the package (a registry that imports it by name)."""
    source = PackageSource(root.parent, root.name)
    stages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()} - foundations
    problems = []
    for module, path in sorted(source.modules().items(), key=lambda item: item[1]):
        rel = path.relative_to(root)
        if str(rel) in ASSEMBLERS:
            continue
        owner = rel.parts[0] if len(rel.parts) > 1 else None
        for line, target in sorted(source.imports(module, typing=True) + source.named(module)):
            parts = target.split(".")
            if len(parts) < 2 or parts[1] not in stages or parts[1] == owner:
                continue
            kind = "stage" if owner in stages else "foundation"
            problem = (f"{root.name}/{rel}:{line}: {kind} {owner or rel.name} imports "
                       f"{'.'.join(parts[:2])} (a stage): move what it needs into a "
                       f"foundation, or read that stage's output file")
            if problem not in problems:
                problems.append(problem)
    return problems


def test_stages_import_foundations_only() -> None:
    problems = layer_violations(PACKAGE, FOUNDATIONS)
    assert not problems, "\n".join(problems)


def test_a_stage_importing_another_is_named(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for package in ("alpha", "beta", "base"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "alpha" / "run.py").write_text("from ..base import util\n\n\ndef f():\n"
                                           "    from ..beta.stage import go\n")
    (root / "base" / "util.py").write_text("from ..alpha import run\n")
    (root / "base" / "registry.py").write_text('FAMILIES = {"x": ("pkg.beta.model", "X")}\n')
    assert layer_violations(root, {"base"}) == [
        "pkg/alpha/run.py:5: stage alpha imports pkg.beta (a stage): move what it needs into a "
        "foundation, or read that stage's output file",
        "pkg/base/registry.py:1: foundation base imports pkg.beta (a stage): move what it "
        "needs into a foundation, or read that stage's output file",
        "pkg/base/util.py:1: foundation base imports pkg.alpha (a stage): move what it needs "
        "into a foundation, or read that stage's output file"]
