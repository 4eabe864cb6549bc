"""The docs keep up with the code: every module is named in docs/architecture.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hwgptbench"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def unnamed_modules(doc: str) -> list[str]:
    """Modules of the package that docs/architecture.md does not name: a top-level module by
    its file name, a package's module in that package's row of the module table. Package
    ``__init__.py`` and ``commands.py`` files follow the layout rule the document states."""
    rows = {m.group(1): line for line in doc.splitlines()
            if (m := re.match(r"\| `([\w/]+)`", line))}
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.name in ("__init__.py", "commands.py"):
            continue
        if len(rel.parts) == 1:
            named = f"`{rel.name}`" in doc
        else:
            row = rows.get(f"{rel.parts[0]}/", "")
            named = "/".join(rel.parts[1:]) in row or f"{rel.parts[1]}/" in row
        if not named:
            missing.append(rel.as_posix())
    return missing


def test_every_module_is_named_in_the_architecture_doc() -> None:
    assert unnamed_modules(ARCHITECTURE.read_text()) == []


def test_an_unnamed_module_is_found() -> None:
    doc = ARCHITECTURE.read_text().replace("`conformal.py`", "conformal")
    assert unnamed_modules(doc) == ["predictors/conformal.py"]


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def broken_links(path: Path) -> list[str]:
    """Relative markdown links of a file whose target does not exist."""
    return [target for target in LINK.findall(path.read_text())
            if "://" not in target and not (path.parent / target).exists()]


def test_the_readme_is_a_map() -> None:
    """Short, and every link resolves (detail lives in docs/)."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 150
    assert len(LINK.findall(readme.read_text())) >= 10
    assert broken_links(readme) == []


def test_links_between_documents_resolve() -> None:
    assert {doc.name: broken_links(doc) for doc in sorted((ROOT / "docs").glob("*.md"))
            if broken_links(doc)} == {}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "here.md").touch()
    page = tmp_path / "page.md"
    page.write_text("[a](here.md) [b](gone.md#part) [c](https://example.org/x.md)")
    assert broken_links(page) == ["gone.md"]


GRAPH_LINE = re.compile(r"(modules|packages): (\d+) nodes, (\d+) arrows, (\d+) floors")


def test_the_import_graph_counts_are_the_current_ones() -> None:
    """docs/architecture.md's import-graph counts are what benchmarks/import_graph.py prints
    for this checkout."""
    import subprocess
    import sys

    printed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "import_graph.py")],
                             capture_output=True, text=True, check=True).stdout
    counts = {kind: numbers for kind, *numbers in GRAPH_LINE.findall(printed)}
    modules, packages = counts["modules"], counts["packages"]
    expected = (f"{packages[0]} packages, {packages[1]} arrows, {packages[2]} floors, no cycle "
                f"and no stage-to-stage arrow now ({modules[0]} modules, {modules[1]} arrows, "
                f"{modules[2]} floors)")
    assert printed.count("cycles none") == 2 and "stage -> stage arrows: 0" in printed, printed
    doc = " ".join(ARCHITECTURE.read_text().split())
    assert expected in doc, (f"docs/architecture.md: update the import-graph counts to "
                             f"'{expected}' (python benchmarks/import_graph.py)")
