"""`make paper`: its tables from the shipped tables, the docs' blocks as its outputs, the params
it validates, and (e2e) the DVC pipeline on a reduced overlay, whose device tables must equal
the docs'."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from conftest import REPO_ROOT, make_project, run, set_param
from hwgptbench import params
from hwgptbench.cli import main
from hwgptbench.figures import paper_docs
from hwgptbench.figures.catalog import PAPER_DEVICE_TABLES
from hwgptbench.figures.paper_tables import (
    cost_vs_size,
    dtype_speed,
    energy,
    front_disagreement,
    kendall_pairs,
)

DOC = REPO_ROOT / "docs" / "paper_scale.md"


def _rows(**columns: list) -> pl.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"status": ["ok"] * n, "device": ["gpu"] * n, "batch_size": [8] * n,
            "seq_len": [1024] * n, "dtype": ["bf16"] * n, "launch": ["cuda_graph"] * n}
    return pl.DataFrame({**base, **columns})


def test_window_power_divides_by_the_counter_periods_drawn_not_by_the_latency() -> None:
    # 0.29 s of window is 3 NVML periods (0.3 s); 6 forwards of 1 J each: 20 W over them
    table = _rows(arch_id=["a", "b", "c"], params=[1.0, 2.0, 3.0],
                  latency_ms=[40.0, 45.0, 50.0], energy_mj=[1000.0, 1100.0, 1300.0],
                  energy_window_s=[0.29, 0.31, 0.30], energy_calls=[6, 6, 6],
                  energy_source=["nvml"] * 3)
    row = energy("s", table).row(0, named=True)
    assert row["window_power_w_median"] == pytest.approx(1100 * 6 / 0.3 / 1000)
    assert row["window_power_w_max"] == pytest.approx(1300 * 6 / 0.3 / 1000)
    # 50 ms of window per forward against 45 ms of latency (the median arch)
    assert row["window_per_forward_over_latency"] == pytest.approx(50 / 45)
    assert row["tau_energy_latency"] == pytest.approx(1.0)
    assert row["mj_per_token_min"] == pytest.approx(1000 / 8192)


def test_eager_over_graph_pairs_the_same_archs_at_the_same_shape() -> None:
    table = pl.concat([
        _rows(arch_id=["a", "b"], params=[1.0, 2.0], latency_ms=[1.0, 2.0],
              memory_peak_mb=[10.0, 20.0]),
        _rows(arch_id=["a", "b"], params=[1.0, 2.0], latency_ms=[3.0, 8.0],
              memory_peak_mb=[10.0, 20.0]).with_columns(launch=pl.lit("eager"))])
    rows = cost_vs_size("s", table)
    assert rows["condition"].to_list() == ["b8-t1024-bf16-cuda_graph", "b8-t1024-bf16-eager"]
    assert rows["eager_over_graph"].to_list() == pytest.approx([3.5, 3.5])  # median of 3, 4
    assert rows["rho_latency_params"].to_list() == pytest.approx([1.0, 1.0])


def test_kendall_pairs_need_five_shared_archs() -> None:
    wide = pl.DataFrame({"arch_id": list("abcdef"),
                         "x": [1.0, 2, 3, 4, 5, 6], "y": [1.0, 2, 3, 4, 6, 5],
                         "z": [1.0, 2, None, None, None, 3]})
    pairs = kendall_pairs("s", wide, "latency_ms", "measured")
    assert pairs.select("a", "b", "archs").rows() == [("x", "y", 6)]
    assert pairs["kendall_tau"][0] == pytest.approx(13 / 15)


def test_front_disagreement_counts_the_archs_on_one_devices_front_only() -> None:
    # perplexity falls a -> f; the gpu's latency rises with it (all six on its front), the
    # cpu's does not: c and e are slower than a cheaper-or-equal, better arch there
    ids = list("abcdef")
    perplexity = pl.DataFrame({"arch_id": ids, "perplexity": [60.0, 50, 40, 30, 20, 10],
                               "train_steps": [100] * 6})
    gpu = _rows(arch_id=ids, latency_ms=[1.0, 2, 3, 4, 5, 6])
    cpu = _rows(arch_id=[*ids, "z"], latency_ms=[10.0, 20, 90, 40, 95, 60, 1.0]).with_columns(
        device=pl.lit("cpu"))
    rows = front_disagreement("s", perplexity, pl.concat([gpu, cpu]),
                              {"gpu": "b8-t1024-bf16-cuda_graph",
                               "cpu": "b8-t1024-bf16-cuda_graph"})
    row = rows.row(0, named=True)
    assert (row["a"], row["b"], row["shared"]) == ("cpu", "gpu", 6)  # z: no perplexity
    assert (row["front_a"], row["front_b"], row["on_both"]) == (4, 6, 4)
    assert (row["only_a"], row["only_b"], row["only_b_examples"]) == (0, 2, "e, c")


def test_dtype_speed_pairs_each_dtype_with_fp32_at_the_same_shape() -> None:
    fp32 = _rows(arch_id=list("abcde"), latency_ms=[10.0, 20, 30, 40, 50]).with_columns(
        dtype=pl.lit("fp32"))
    bf16 = _rows(arch_id=list("abcdef"), latency_ms=[5.0, 12, 15, 36, 25, 1])
    rows = dtype_speed("m", pl.concat([fp32, bf16]))
    row = rows.row(0, named=True)
    assert (rows.height, row["condition"], row["dtype"], row["archs"]) == (
        1, "b8-t1024-cuda_graph", "bf16", 5)
    assert row["ratio_median"] == pytest.approx(0.5)  # 0.5, 0.6, 0.5, 0.9, 0.5
    assert (row["ratio_min"], row["ratio_max"]) == pytest.approx((0.5, 0.9))
    assert row["kendall_tau"] == pytest.approx(0.8)  # d and e swap: 9 of 10 pairs agree
    assert dtype_speed("m", bf16).is_empty()  # no fp32 to compare with


def test_docs_blocks_are_rewritten_from_the_run_and_their_figures_copied(tmp_path: Path
                                                                         ) -> None:
    tables, figures, docs = tmp_path / "tables", tmp_path / "figures", tmp_path / "docs"
    for folder in (tables, figures, docs):
        folder.mkdir()
    (tables / "fronts.md").write_text("| a |\n| - |\n| 2 |\n")
    (figures / "s_pareto_latency.png").write_bytes(b"png")
    doc = docs / "page.md"
    doc.write_text("text\n<!-- paper:fronts -->\n| a |\n| - |\n| 1 |\n<!-- /paper -->\n"
                   "![fronts](img/paper/s_pareto_latency.png)\n")
    assert paper_docs.differences(doc.read_text(), tables) == ["fronts"]
    written = paper_docs.sync(doc, tables, figures)
    assert written == [doc, docs / "img/paper/s_pareto_latency.png"]
    assert paper_docs.blocks(doc.read_text()) == {"fronts": "| a |\n| - |\n| 2 |\n"}
    assert paper_docs.differences(doc.read_text(), tables) == []
    assert (docs / "img/paper/s_pareto_latency.png").read_bytes() == b"png"
    doc.write_text("<!-- paper:energy -->\nold\n<!-- /paper -->\n")
    with pytest.raises(paper_docs.MissingPaperOutput, match="energy.md.*make paper"):
        paper_docs.sync(doc, tables, figures)
    assert doc.read_text() == "<!-- paper:energy -->\nold\n<!-- /paper -->\n"  # unchanged


def test_the_docs_hold_every_device_and_search_table_of_the_paper() -> None:
    names = set(paper_docs.blocks(DOC.read_text(encoding="utf-8")))
    assert set(PAPER_DEVICE_TABLES) <= names
    assert {"search_reference", "search_hypervolume", "search_rank_tests"} <= names


@pytest.mark.parametrize(("field", "value", "message"), [
    (["search", "objectives"], ["ppl-energy"],
     r"paper\.search\.objectives: \['ppl-energy'\] are not keys of paper\.search"),
    (["search", "algorithms"], ["rs", "moasha"], r"paper\.search\.algorithms: moasha"),
    (["external", "report_k"], 7, r"paper\.external\.report_k: 7 is not one of"),
])
def test_paper_params_are_checked_before_any_job(field: list[str], value: object,
                                                 message: str) -> None:
    doc = params.load(REPO_ROOT / "params.yaml")
    node = doc["paper"]
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = value
    with pytest.raises(params.ParamsError, match=message):
        params.validate(doc)


def test_transfer_external_without_data_writes_how_to_add_it(tmp_path: Path) -> None:
    main(["transfer-external", "--params", str(REPO_ROOT / "params.yaml"),
          "--out-dir", str(tmp_path / "external")])
    note = (tmp_path / "external" / "external.md").read_text()
    assert "skipped" in note and "paper.external.help_fbnet" in note
    assert "github.com/HayeonLee/HELP" in note


def _cells(markdown: str, scale: str) -> list[list[str]]:
    """The header and the rows of one scale of a markdown table, as stripped cells (a table
    of fewer scales pads its columns otherwise)."""
    lines = [[cell.strip() for cell in line.strip().strip("|").split("|")]
             for line in markdown.splitlines() if line.startswith("|")]
    return [lines[0], *(row for row in lines[2:] if row[0] == scale)]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project copy whose only pipeline run is the paper's (`dvc repro paper/dvc.yaml`) on a
    reduced overlay, committed with its params; no dvc.lock of the workflow's pipeline."""
    project = make_project(tmp_path_factory.mktemp("paper"))
    if (project / "dvc.lock").exists():  # a lock of the checkout the copy was made from
        run(["git", "rm", "-q", "dvc.lock"], project)
    set_param(project, ["paper", "scales"], ["s"])
    set_param(project, ["paper", "search"], {
        **params.load(project / "params.yaml")["paper"]["search"],
        "objectives": ["ppl-latency"], "algorithms": ["rs", "nsga2"], "budget": 12,
        "seeds": 2, "reference_archs": 300})
    run(["git", "commit", "-qam", "reduced paper overlay"], project)
    run(["dvc", "repro", "paper/dvc.yaml"], project, baseline_s=50)  # 36-57 s measured
    return project


@pytest.mark.e2e
def test_make_paper_on_a_reduced_overlay_equals_the_docs_and_is_then_current(
        paper_run: Path) -> None:
    project = paper_run
    tables = project / "results" / "paper" / "tables"
    docs = paper_docs.blocks(DOC.read_text(encoding="utf-8"))
    for name in PAPER_DEVICE_TABLES:
        ran, doc = _cells((tables / f"{name}.md").read_text(), "s"), _cells(docs[name], "s")
        if len(doc) == 1:  # no s row in the docs (dtype_speed: bf16 was timed at m only)
            assert len(ran) == 1, name
        else:
            assert ran == doc, name
    assert "skipped" in (tables / "external.md").read_text()
    assert pl.read_csv(tables / "search_hypervolume.csv")["algorithm"].sort().to_list() == [
        "nsga2", "rs"]
    assert json.loads(run(["dvc", "status", "--json", "paper/dvc.yaml"], project).stdout) == {}
    assert "Nothing to be done" in run(["snakemake", "-n", "paper"], project).stdout
    # the paper's pipeline is not part of `make run`'s: the workflow's stages are untouched
    assert not (project / "results" / "tiny").exists()


@pytest.mark.e2e
def test_a_paper_only_remote_pulls_into_a_fresh_clone_with_nothing_left_to_do(
        paper_run: Path, tmp_path: Path) -> None:
    """Only results/paper is pushed, and only paper/dvc.lock committed: the pull fetches the
    paper's pipeline, names the workflow's (no dvc.lock) once as not pulled, and exits 0 with
    both tools current for the paper."""
    run(["dvc", "push", "--remote", "local", "paper/dvc.yaml"], paper_run)
    source = tmp_path / "source"  # the pushed commit: paper/dvc.lock, no dvc.lock
    run(["git", "clone", "-q", str(paper_run), str(source)], tmp_path)
    (source / "paper" / "dvc.lock").write_bytes((paper_run / "paper" / "dvc.lock").read_bytes())
    run(["git", "add", "paper/dvc.lock"], source)
    run(["git", "commit", "-qm", "paper results"], source)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(source), str(clone)], tmp_path)
    run(["dvc", "remote", "modify", "--local", "local", "url", str(paper_run.parent / "remote")],
        clone)
    assert not (clone / "dvc.lock").exists() and not (clone / "results").exists()

    pulled = run(["hwgptbench", "pull", "--remote", "local"], clone, baseline_s=10)  # 6.6 s
    log = pulled.stdout + pulled.stderr
    assert log.count("is not pulled") == 1 and "paper/dvc.yaml is not pulled" not in log, log
    assert "No file hash info" not in log and "ERROR" not in log, log
    produced = sorted(path.relative_to(paper_run).as_posix()
                      for path in (paper_run / "results" / "paper").rglob("*") if path.is_file())
    assert produced and all((clone / name).read_bytes() == (paper_run / name).read_bytes()
                            for name in produced)
    assert not (clone / "results" / "tiny").exists()
    assert json.loads(run(["dvc", "status", "--json", "paper/dvc.yaml"], clone).stdout) == {}
    assert "Nothing to be done" in run(["snakemake", "-n", "paper"], clone).stdout


def test_pull_reads_the_paper_lock_under_its_dvc_status_address(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    from hwgptbench.pipeline.remote import current_targets, locked_stages

    (tmp_path / "paper").mkdir()
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  data:\n    cmd: snakemake data\n    outs:\n"
        "    - path: results/data\n")
    (tmp_path / "paper" / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  paper:\n    cmd: snakemake paper\n    outs:\n"
        "    - path: results/paper\n")
    monkeypatch.chdir(tmp_path)
    locked = locked_stages()
    assert set(locked) == {"data", "paper/dvc.yaml:paper"}
    assert current_targets(locked, set()) == ["data", "paper"]
    assert current_targets(locked, {"paper/dvc.yaml:paper"}) == ["data"]


def test_a_pull_without_targets_takes_the_pipelines_that_have_a_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    from hwgptbench.pipeline.remote import default_targets, lock_of

    (tmp_path / "paper").mkdir()
    (tmp_path / "devices").mkdir()
    for name in ("dvc.yaml", "paper/dvc.yaml", "paper/dvc.lock", "devices/a.parquet.dvc"):
        (tmp_path / name).write_text("stages: {}\n")
    run(["git", "init", "-q"], tmp_path)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="hwgptbench.pipeline.remote"):
        assert sorted(default_targets() or []) == ["devices/a.parquet.dvc", "paper/dvc.yaml"]
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        "dvc.yaml is not pulled"]
    assert "make run builds them" in caplog.records[0].getMessage()
    assert lock_of("paper/dvc.yaml:paper") == Path("paper/dvc.lock")
    assert lock_of("search@tiny") == Path("dvc.lock")
    assert lock_of("devices/a.parquet.dvc") is None


def test_a_pull_with_no_lock_at_all_says_there_is_nothing_to_pull(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hwgptbench.pipeline import remote

    monkeypatch.setattr(remote, "remote_to_pull", lambda *args: "local")
    monkeypatch.setattr(remote, "default_targets", lambda: [])
    with pytest.raises(remote.NothingToPullError, match="nothing to pull: no pipeline here has "
                                                        "a lock file"):
        remote.pull()
