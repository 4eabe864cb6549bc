"""HW-GPT-Bench's published perplexities: dvc import from a local repository laid out as the
published one, conversion to the perplexity table, the restricted unpickler, offline errors."""

from __future__ import annotations

import json
import math
import pickle
import pickletools
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT, Hostile, run
from hwgptbench.cli import main
from hwgptbench.hwgpt_import.fetch import fetch
from hwgptbench.hwgpt_import.unpickle import load
from hwgptbench.hwgpt_source import FILES, REV, PublishedDataError, label
from hwgptbench.schema import fully_trained
from hwgptbench.space import Arch, SearchSpace

# DVC's own deprecation notices, from its in-process import
pytestmark = [pytest.mark.e2e,  # spawns dvc
              pytest.mark.filterwarnings("ignore:_NoneStep.value:DeprecationWarning")]

PARAMS = str(REPO_ROOT / "params.yaml")
SPACES = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["spaces"]


def _space(scale: str) -> SearchSpace:
    return SearchSpace.from_dict(scale, SPACES[scale])


def _row(scale: str, arch: Arch, perplexity: float, accuracy: float = 0.4,
         **overrides: Any) -> dict[str, Any]:
    """A published row: head and ratio lists padded to the space's maximum layer count."""
    space = _space(scale)
    pad = space.max_n_layer - arch.n_layer
    published = {"sample_embed_dim": arch.embed_dim, "sample_n_layer": arch.n_layer,
                 "sample_layer_indices": list(range(arch.n_layer)),
                 "sample_n_head": list(arch.n_head) + [space.n_head[-1]] * pad,
                 "sample_mlp_ratio": list(arch.mlp_ratio) + [space.mlp_ratio[0]] * pad,
                 "sample_bias": arch.bias}
    return {"accuracy": accuracy, "perplexity": perplexity, "arch": {**published, **overrides}}


def _archs(scale: str, n: int) -> list[Arch]:
    return _space(scale).sample(n, seed=1)


def _published(s_value: float) -> dict[str, list[dict[str, Any]]]:
    """Rows per repository path: each scale with a duplicate and rows outside the space."""
    s, m, l_ = _archs("s", 3), _archs("m", 3), _archs("l", 2)
    rows: dict[str, list[dict[str, Any]]] = {path: [] for paths in FILES.values()
                                             for path in paths}
    rows["arch_ppl_bench_s/ppl.pkl"] = [
        _row("s", s[0], s_value), _row("s", s[1], 30.0), _row("s", s[2], 25.0),
        _row("s", s[0], 36.0),  # a duplicate, another value
        _row("s", s[1], 30.0, sample_embed_dim=100),  # not a choice
        _row("s", s[2], 25.0, sample_layer_indices=list(range(0, 2 * s[2].n_layer, 2)))]
    for a in range(0, 10_000, 1000):  # the s trackers repeat ppl.pkl in the real repository
        rows[f"arch_ppl_bench_s/ppl_observations_tracker_{a}_{a + 1000}.pkl"] = []
    rows["arch_ppl_bench_m/ppl_observations_tracker_0_1000.pkl"] = [
        _row("m", m[0], 28.0), _row("m", m[1], 27.0, sample_n_head=[10] * 24)]
    rows["arch_ppl_bench_m/ppl_observations_tracker_5000_6000.pkl"] = [
        _row("m", m[2], 26.0), _row("m", m[0], 28.0)]  # duplicate in another file, same value
    rows["arch_ppl_bench_l/ppl_observations_tracker_9000_10000.pkl"] = [
        _row("l", a, 20.0 + i) for i, a in enumerate(l_)]
    return rows


def _commit(repo: Path, rows: dict[str, list[dict[str, Any]]], message: str) -> str:
    for path, content in rows.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(pickle.dumps(content, protocol=4))
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", message], repo)
    return run(["git", "rev-parse", "HEAD"], repo).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A git repository laid out as HW-GPT-Bench's, with two commits: (path, first, second)."""
    repo = tmp_path_factory.mktemp("upstream")
    run(["git", "init", "-q", "-b", "main"], repo)
    first = _commit(repo, _published(33.0), "published")
    second = _commit(repo, {"arch_ppl_bench_s/ppl.pkl": _published(34.0)[
        "arch_ppl_bench_s/ppl.pkl"]}, "changed")
    return repo, first, second


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    run(["git", "init", "-q", "-b", "main"], project)
    run(["dvc", "init", "-q"], project)
    return project


@pytest.fixture(scope="module")
def imported(upstream: tuple[Path, str, str], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, list[Path]]:
    """A DVC project with every scale's files imported from the first commit."""
    repo, first, _ = upstream
    project = _project(tmp_path_factory.mktemp("imported"))
    pointers = fetch(list(FILES), project / "data/hwgptbench", str(repo), first)
    return project, pointers


def _import(project: Path, scale: str, *extra: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    out = project / f"results/{scale}/perplexity.parquet"
    assert main(["import-perplexity", "--params", PARAMS, "--scale", scale, "--files",
                 str(project / "data/hwgptbench"), "--out", str(out), *extra]) == 0
    report = json.loads(out.with_suffix(".import.json").read_text())
    return pl.read_parquet(out), report


def test_published_files_need_no_globals(upstream: tuple[Path, str, str]) -> None:
    """The fixture's pickles, like the published ones, hold only plain data."""
    data = (upstream[0] / "arch_ppl_bench_s/ppl.pkl").read_bytes()
    assert not {op.name for op, _, _ in pickletools.genops(data)} & {
        "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "PERSID"}
    assert load(upstream[0] / "arch_ppl_bench_s/ppl.pkl", "r")[1]["perplexity"] == 30.0


def test_dvc_import_records_url_and_revision(upstream: tuple[Path, str, str],
                                             imported: tuple[Path, list[Path]]) -> None:
    repo, first, _ = upstream
    project, pointers = imported
    assert len(pointers) == sum(len(paths) for paths in FILES.values())
    stage = yaml.safe_load(pointers[0].read_text())
    assert stage["frozen"] is True
    assert stage["deps"][0]["path"] == "arch_ppl_bench_s/ppl.pkl"
    assert stage["deps"][0]["repo"] == {"url": str(repo), "rev": first, "rev_lock": first}
    assert "/ppl.pkl" in (project / "data/hwgptbench/arch_ppl_bench_s/.gitignore").read_text()
    assert "up to date" in run(["dvc", "status"], project).stdout
    # a second fetch keeps what is there
    before = pointers[0].stat().st_mtime_ns
    assert fetch(["s"], project / "data/hwgptbench", str(repo), first) == pointers[:1]
    assert pointers[0].stat().st_mtime_ns == before


def test_convert_counts_duplicates_and_archs_outside_the_space(
        upstream: tuple[Path, str, str], imported: tuple[Path, list[Path]]) -> None:
    repo, first, _ = upstream
    project, _ = imported
    table, report = _import(project, "s")
    s = _archs("s", 3)
    assert table.columns == ["arch_id", "params", "train_steps", "val_loss", "perplexity",
                             "accuracy", "source"]
    assert table["arch_id"].to_list() == [a.id for a in s]  # order of first publication
    assert all(Arch.from_id(i).id == i for i in table["arch_id"])
    assert set(table["source"]) == {label(str(repo), first)}
    by_id = dict(zip(table["arch_id"], table["perplexity"], strict=True))
    assert by_id[s[0].id] == pytest.approx(math.sqrt(33.0 * 36.0))  # geometric mean
    assert by_id[s[1].id] == 30.0  # published once: kept exactly
    assert table["val_loss"].to_list() == pytest.approx([math.log(p) for p in table["perplexity"]])
    assert table["params"].to_list() == [_space("s").n_params(a, 50304) for a in s]
    assert fully_trained(table).height == 3  # one fidelity
    assert report["rows"] == 6 and report["archs"] == 3
    assert report["duplicates"] | {"kept": None, "max_relative_spread": None} == {
        "archs": 1, "extra_rows": 1, "differing": 1, "kept": None, "max_relative_spread": None}
    assert report["outside_space"]["rows"] == 2
    assert report["outside_space"]["by_field"] == {"embed_dim": 1, "layer_indices": 1}
    assert [e["row"] for e in report["outside_space"]["examples"]] == [4, 5]

    m_table, m_report = _import(project, "m", "--source-url", "https://github.com/x/y")
    assert m_table.height == 2 and m_report["rows"] == 4
    assert m_report["duplicates"]["archs"] == 1 and m_report["duplicates"]["differing"] == 0
    assert m_report["outside_space"]["by_field"] == {"n_head": 1}
    assert set(m_table["source"]) == {f"github.com/x/y@{first}"}
    l_table, l_report = _import(project, "l")
    assert l_table.height == 2 and l_report["outside_space"]["rows"] == 0


def test_dvc_update_moves_to_another_revision(upstream: tuple[Path, str, str],
                                              tmp_path: Path) -> None:
    repo, first, second = upstream
    project = _project(tmp_path)
    (pointer,) = fetch(["s"], project / "data/hwgptbench", str(repo), first)
    run(["dvc", "update", "--rev", second, str(pointer)], project)
    assert "up to date" in run(["dvc", "status"], project).stdout
    table, report = _import(project, "s")
    assert report["rev"] == second and set(table["source"]) == {label(str(repo), second)}
    assert table["perplexity"][0] == pytest.approx(math.sqrt(34.0 * 36.0))
    with pytest.raises(PublishedDataError, match="pointers record commit"):
        from hwgptbench.hwgpt_import.convert import locate
        locate("s", project / "data/hwgptbench", rev=first)


def test_unknown_revision_is_named(upstream: tuple[Path, str, str], tmp_path: Path) -> None:
    project = _project(tmp_path)
    with pytest.raises(PublishedDataError, match=f"has no revision {'0' * 40}.*{REV}"):
        fetch(["l"], project / "data/hwgptbench", str(upstream[0]), "0" * 40)


def test_unreachable_repository_is_one_clear_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path)
    missing = tmp_path / "no-such-repository"
    with pytest.raises(PublishedDataError) as err:
        fetch(["s"], project / "data/hwgptbench", str(missing), REV)
    message = str(err.value)
    assert str(missing) in message and REV in message
    assert "network access" in message and "--url a local clone" in message
    assert not list((project / "data").rglob("*.dvc"))
    assert main(["fetch-hwgptbench", "--scale", "m", "--url", str(missing),
                 "--out", str(project / "data/hwgptbench")]) == 2
    assert capsys.readouterr().err.count("error:") == 1


def test_hostile_pickle_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "marker"
    files = tmp_path / "files"
    path = files / "arch_ppl_bench_s/ppl.pkl"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps([{"perplexity": 30.0, "accuracy": 0.4,
                                    "arch": Hostile(marker)}]))
    with pytest.raises(PublishedDataError, match=r"refusing to load .*ppl\.pkl \(revision r1\): "
                                                 r"it asks for the global \w+\.open"):
        load(path, "r1")
    assert main(["import-perplexity", "--params", PARAMS, "--scale", "s", "--files", str(files),
                 "--source-url", "https://example.org/x", "--rev", "r1",
                 "--out", str(tmp_path / "ppl.parquet")]) == 2
    err = capsys.readouterr().err
    assert "refusing to load" in err and str(path) in err and "revision r1" in err
    assert not marker.exists() and not (tmp_path / "ppl.parquet").exists()


def test_files_without_provenance_or_structure_are_named(tmp_path: Path) -> None:
    from hwgptbench.hwgpt_import.convert import convert, locate

    files = tmp_path / "files"
    path = files / "arch_ppl_bench_s/ppl.pkl"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps([{"perplexity": 30.0, "accuracy": 0.4}]))
    with pytest.raises(PublishedDataError, match="no DVC import pointer.*fetch-hwgptbench"):
        locate("s", files)
    with pytest.raises(PublishedDataError, match="are missing.*fetch-hwgptbench --scale m"):
        locate("m", files)
    paths, source, rev = locate("s", files, "https://example.org/x", "r1")
    assert source == "example.org/x@r1"
    with pytest.raises(PublishedDataError, match=r"arch_ppl_bench_s/ppl\.pkl\[0\]: expected"):
        convert(_space("s"), paths, source, rev)
