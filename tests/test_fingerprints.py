"""A rule's code fingerprint (hwgptbench.pipeline.fingerprints): the input through which
Snakemake reruns a rule's jobs when the code its commands run changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hwgptbench.errors import UserError
from hwgptbench.pipeline import dvc_deps, fingerprints


def project(tmp_path: Path) -> Path:
    """A project whose rule `fit` lists a module and a package folder (with its data)."""
    (tmp_path / "src" / "pkg" / "data").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / "src" / "pkg" / "data" / "table.csv").write_text("a,b\n")
    listing = tmp_path / fingerprints.LISTINGS / "fit.txt"
    listing.parent.mkdir(parents=True)
    listing.write_text(dvc_deps.listing_text("fit", ["src/pkg/data", "src/pkg/model.py"]))
    return tmp_path


def test_the_fingerprint_changes_exactly_when_a_listed_file_does(tmp_path: Path) -> None:
    root = project(tmp_path)
    path = fingerprints.code_input("fit", root)
    assert path == "results/.code/fit.sha256"
    written = root / path
    first = written.read_text()
    os.utime(written, (0, 0))
    fingerprints.content_hash.cache_clear()
    assert fingerprints.code_input("fit", root) == path
    assert written.stat().st_mtime == 0  # same code: not rewritten, so no rerun
    (root / "src" / "pkg" / "data" / "table.csv").write_text("a,b\n1,2\n")
    fingerprints.content_hash.cache_clear()
    fingerprints.code_input("fit", root)
    assert written.read_text() != first and written.stat().st_mtime > 0
    # a file's name is part of the fingerprint, not only its content
    (root / "src" / "pkg" / "data" / "table.csv").rename(root / "src" / "pkg" / "data" / "t.csv")
    before = written.read_text()
    fingerprints.code_input("fit", root)
    assert written.read_text() != before


def test_a_rule_without_its_listing_is_named_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path)
    with pytest.raises(UserError, match=r"rule train has no code listing; run `make deps`"):
        fingerprints.code_input("train", root)
    (root / "src" / "pkg" / "model.py").unlink()
    with pytest.raises(UserError, match=r"model.py: listed as code in workflow/code/ but "
                                        r"missing; run `make deps`"):
        fingerprints.code_input("fit", root)
    # `make deps` plans the jobs before their listings exist
    monkeypatch.setenv(fingerprints.PLANNING_ENV, "1")
    assert (root / fingerprints.code_input("train", root)).is_file()


def test_listings_are_written_compared_and_removed(tmp_path: Path) -> None:
    root = project(tmp_path)
    stale = root / fingerprints.LISTINGS / "gone.txt"
    stale.write_text(dvc_deps.listing_text("gone", []))
    wanted = {"fit": ["src/pkg/data", "src/pkg/model.py"], "new": ["src/pkg/model.py"]}
    found, changes = dvc_deps.listings_update(root, wanted)
    assert found == ["workflow/code/new.txt: its entries differ from the code rule new runs",
                     "workflow/code/gone.txt: no rule gone runs a command"]
    assert changes == {root / fingerprints.LISTINGS / "new.txt":
                       dvc_deps.listing_text("new", ["src/pkg/model.py"]), stale: None}
    assert fingerprints.listing("fit", root) == wanted["fit"]
