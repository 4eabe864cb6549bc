"""The cache of the shipped tables' surrogates is bound to what it is for (docs/security.md):
its ``cache.json`` names its scale, search space, vocabulary and key, and every load checks
it, so a cache copied under another scale's name, a link, a file or a folder of someone
else's is refused with one message and left as it is, never queried, fitted over or
deleted."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import run
from hwgptbench import published
from hwgptbench.cli import main
from hwgptbench.predictors import fitting
from hwgptbench.published.surrogates import (
    CACHE,
    PublishedCacheError,
    binding,
    cache_dir,
    ensure_surrogates,
)
from test_security import reseal

ROWS = 60  # of the l table: fitted in seconds


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of shipped tables: the first rows of the l perplexity table, no device."""
    root = tmp_path_factory.mktemp("shipped")
    source = root / "l.parquet"
    published.perplexity_table("l").head(ROWS).write_parquet(source)
    folder = root / "published"
    published.ship("l", published.space("l"), published.vocab_size("l"), source, folder=folder)
    return folder


@pytest.fixture(scope="module")
def fitted(shipped: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder whose cache holds the surrogates of the shipped l rows."""
    results = tmp_path_factory.mktemp("cache") / "results"
    ensure_surrogates("l", results, shipped)
    return results


@pytest.fixture
def results(fitted: Path, tmp_path: Path) -> Path:
    shutil.copytree(fitted, tmp_path / "results", symlinks=True)
    return tmp_path / "results"


@pytest.fixture
def no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any fit from here on fails the test."""
    def fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache was fitted")
    monkeypatch.setattr(fitting, "fit_perplexity", fit)
    monkeypatch.setattr(fitting, "fit_device", fit)


def test_the_cache_is_bound_to_its_scale_space_vocabulary_and_key(
        results: Path, shipped: Path, no_fit: None) -> None:
    folder = cache_dir("l", results, shipped)
    bound = json.loads((folder / CACHE).read_text())
    assert bound == binding("l", shipped)
    assert (bound["scale"], bound["space"], bound["vocab_size"]) == (
        "l", published.space("l").to_dict(), 50304)
    assert folder.name == f"l-{bound['key']}"
    assert ensure_surrogates("l", results, shipped) == folder  # read, not fitted again


def test_a_cache_copied_under_another_scale_is_refused_and_kept(
        results: Path, shipped: Path, no_fit: None) -> None:
    """The l cache under the m key of the package's tables answers no m query."""
    copy = cache_dir("m", results)
    shutil.copytree(cache_dir("l", results, shipped), copy)
    with pytest.raises(PublishedCacheError, match=rf"{re.escape(str(copy / CACHE))} does not "
                                                  r"bind .* shipped m "
                                                  r"tables \(its scale, space, key differ.*: "
                                                  r"delete it"):
        ensure_surrogates("m", results)
    assert (copy / CACHE).is_file()


LINKS = ("dangling-link", "link-to-a-cache")


@pytest.mark.parametrize("kind", [*LINKS, "file", "folder-of-others", "cache-json-junk"])
def test_what_is_not_the_cache_is_refused_and_kept(results: Path, shipped: Path, kind: str,
                                                   no_fit: None) -> None:
    folder = cache_dir("l", results, shipped)
    real = folder.with_name("real")
    folder.rename(real)
    if kind == "dangling-link":
        folder.symlink_to(results / "nowhere")
    elif kind == "link-to-a-cache":
        folder.symlink_to(real, target_is_directory=True)
    elif kind == "file":
        folder.write_text("mine")
    elif kind == "folder-of-others":
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
    else:
        shutil.copytree(real, folder)
        (folder / CACHE).write_text("{junk")
    reason = {"dangling-link": "is a symbolic link", "link-to-a-cache": "is a symbolic link",
              "file": "is not a folder", "folder-of-others": f"has no {CACHE}",
              "cache-json-junk": "cannot be read as JSON"}[kind]
    before = sorted(os.listdir(results / "published"))
    with pytest.raises(PublishedCacheError, match=rf"{re.escape(str(folder))}.* {reason}.*"
                                                  "delete it"):
        ensure_surrogates("l", results, shipped)
    assert sorted(os.listdir(results / "published")) == before
    assert folder.is_symlink() == (kind in LINKS)


def test_a_cached_surrogate_of_another_vocabulary_is_refused(results: Path,
                                                            shipped: Path) -> None:
    folder = cache_dir("l", results, shipped)
    metadata = folder / "perplexity" / "lightgbm" / "metadata.json"
    document = json.loads(metadata.read_text())
    document["feature_args"]["vocab_size"] = 64
    metadata.write_text(json.dumps(document))
    reseal(metadata.parent)
    with pytest.raises(PublishedCacheError, match=rf"{re.escape(str(metadata))} is a "
                                                  "surrogate of another "
                                                  "search space or vocabulary"):
        ensure_surrogates("l", results, shipped)


def test_query_refuses_a_linked_cache_with_one_message(tmp_path: Path) -> None:
    """`hwgptbench query --scale m` on a dangling link where the cache belongs: refused at
    once (no fit), one message naming it, the link kept."""
    link = cache_dir("m", tmp_path / "results")
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "nowhere")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["query", "--scale", "m", "--results", str(tmp_path / "results"),
                     "--metric", "perplexity", "--arch",
                     published.perplexity_table("m")["arch_id"][0]])
    assert code == 2, err.getvalue()
    assert err.getvalue().count("error:") == 1 and "Traceback" not in err.getvalue()
    assert f"{link} is a symbolic link" in err.getvalue() and link.is_symlink()


def test_query_refuses_a_copied_cache_with_one_message(results: Path, shipped: Path) -> None:
    """The copy of the l cache under the m key: exit 2 and one message, not m's answers from
    the l surrogates."""
    shutil.copytree(cache_dir("l", results, shipped), cache_dir("m", results))
    arch = published.perplexity_table("m")["arch_id"][0]
    result = run(["hwgptbench", "query", "--scale", "m", "--results", str(results),
                  "--metric", "perplexity", "--arch", arch], results, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert f"{cache_dir('m', results) / CACHE} does not bind" in result.stderr
