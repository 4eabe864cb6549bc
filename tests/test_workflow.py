"""End to end: the workflow through DVC, pushed to a local remote, pulled into a fresh clone.

Snakemake judges staleness by mtimes and its own metadata, DVC by content hashes; these tests
hold the two in agreement (docs/workflow.md)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import make_project, run, set_param, tool_env, use_test_params
from hwgptbench.cli import TRACE_ENV

pytestmark = pytest.mark.e2e  # spawns snakemake or dvc

NOTHING_TO_DO = "Nothing to be done"
ALL_STAGES = {"data", "supernet", "sample_archs", "perplexity", "measure", "measure_device",
              "measurements", "runtime", "runtime_merged", "surrogates_perplexity",
              "surrogates_device", "surrogate_quality",
              "search_reference", "search", "search_summary", "figures_of_scale", "transfer",
              "compress_dense", "compress_finetune", "compress_search", "compress_table",
              "compress_finetune_methods", "compress", "compress_export"}
SEARCH_AND_FIGURES = {"search_reference", "search", "search_summary", "figures_of_scale"}
# The whole workflow, small enough for a test.
def dvc_status(repo: Path) -> dict:
    """The stages of the workflow's pipeline (dvc.yaml) that are not current; the paper's
    pipeline (paper/dvc.yaml, `make paper`) is not part of `make run`."""
    return json.loads(run(["dvc", "status", "--json", "dvc.yaml"], repo).stdout or "{}")


def snakemake_jobs(repo: Path, *targets: str) -> set[str]:
    """Rules Snakemake would run now to make targets (default: all; dry run), 'all' excluded."""
    out = run(["snakemake", "-n", *targets], repo).stdout
    if NOTHING_TO_DO in out:
        return set()
    table = out.split("Job stats:")[1].strip().split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()[2:]]  # after header and rule line
    return {row[0] for row in rows} - {"all", "total"}


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project after `dvc repro` and `dvc push`, with dvc.lock committed."""
    repo = make_project(tmp_path_factory.mktemp("e2e"))
    use_test_params(repo)
    run(["git", "commit", "-qam", "test params"], repo)
    traces = repo.parent / "import-traces"  # what each command of the run loaded
    traces.mkdir()
    run(["dvc", "repro"], repo, env=tool_env() | {TRACE_ENV: str(traces)})
    assert (repo / "results" / "tiny" / "supernet" / "supernet-step-2.pt").exists()
    assert set(pl.read_parquet(repo / "results" / "tiny" / "perplexity.parquet")["train_steps"]
               ) == {2, 3}
    assert (repo / "results" / "tiny" / "measurements.parquet").exists()
    assert (repo / "results" / "tiny" / "surrogate_quality.json").exists()
    final = pl.read_parquet(repo / "results" / "tiny" / "search" / "final.parquet")
    assert sorted(final["algorithm"]) == sorted(yaml.safe_load(
        (repo / "params.yaml").read_text())["search"]["algorithms"])
    assert (final["cost"] <= 6 + 1e-9).all()
    assert json.loads((repo / "results" / "tiny" / "search_metrics.json").read_text())
    assert (repo / "results" / "tiny" / "figures" / "hypervolume.svg").stat().st_size > 0
    compress = pl.read_parquet(repo / "results" / "compress" / "llama-tiny" / "compress.parquet")
    assert {"dense", "largest, fine-tuned"} <= set(compress["model"])
    assert set(compress["quant"]) == {"none", "int8_dynamic"}
    assert (compress["size_mb"] > 0).all() and (compress["tokens_per_s"] > 0).all()
    assert (repo / "results" / "compress" / "llama-tiny" / "figures" / "compress.png").exists()
    exports = pl.read_parquet(repo / "results" / "compress" / "llama-tiny" / "export"
                              / "exports.parquet")
    assert exports.filter(pl.col("skipped").is_null())["passed"].all()
    assert set(exports.filter(pl.col("skipped").is_null())["format"]) == {"pt2", "hf"}
    assert dvc_status(repo) == {}
    assert snakemake_jobs(repo) == set()
    run(["dvc", "push"], repo)
    run(["git", "add", "dvc.lock"], repo)
    run(["git", "commit", "-qm", "results"], repo)
    return repo


def test_code_deps_cover_what_every_command_loaded(pushed: Path) -> None:
    """The modules each command of the whole run really loaded (its import trace) are in the
    code that `hwgptbench.pipeline.code_closure` derives for it from the imports, from which
    dvc.yaml's deps are written: nothing a command loads escapes its stage's dependencies."""
    from hwgptbench.pipeline.code_closure import PACKAGE, closure, handler_modules

    traces = sorted((pushed.parent / "import-traces").glob("*.txt"))
    commands = {path.stem.rsplit("-", 1)[0] for path in traces}
    assert {"data", "train", "measure", "search", "figures", "compress-table"} <= commands
    for path in traces:
        command = path.stem.rsplit("-", 1)[0]
        derived = handler_modules(command) | closure({f"{PACKAGE}.cli"})
        missed = set(path.read_text().split()) - derived
        assert not missed, f"{command} loaded {sorted(missed)}, which its derived code misses"


def fresh_clone(source: Path, dest: Path, remote: Path | None = None) -> Path:
    """A git clone of ``source`` using the DVC remote ``remote`` (default: source's sibling)."""
    run(["git", "clone", "-q", str(source), str(dest)], source.parent)
    remote = remote or source.parent / "remote"
    run(["dvc", "remote", "modify", "--local", "local", "url", str(remote)], dest)
    return dest


@pytest.fixture(scope="module")
def pulled(pushed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of the pushed project with every result pulled; the tests that use it
    leave it as they found it (one clone and pull for them all)."""
    repo = fresh_clone(pushed, tmp_path_factory.mktemp("pulled") / "clone")
    run(["hwgptbench", "pull"], repo)
    return repo


def test_pull_into_fresh_clone_is_up_to_date_in_both_tools(pushed: Path, pulled: Path) -> None:
    repo = pulled
    original = pushed / "results" / "data" / "shakespeare"
    pulled = repo / "results" / "data" / "shakespeare"
    for path in original.glob("*.*"):
        assert (pulled / path.name).read_bytes() == path.read_bytes()
    assert snakemake_jobs(repo) == set()
    assert dvc_status(repo) == {}

    # a params change reruns exactly the stages that read it (and Snakemake what they feed)
    set_param(repo, ["surrogate", "seed"], 7)
    assert snakemake_jobs(repo) == {"surrogates_perplexity", "surrogates_device",
                                    "surrogate_quality"} | SEARCH_AND_FIGURES
    assert set(dvc_status(repo)) == {"surrogates@tiny"}
    # a search space that is not run changes nothing
    set_param(repo, ["spaces", "s", "n_layer"], [10, 12])
    assert set(dvc_status(repo)) == {"surrogates@tiny"}
    run(["git", "checkout", "params.yaml"], repo)
    set_param(repo, ["perplexity", "seed"], 7)
    assert snakemake_jobs(repo) == {"perplexity", "surrogates_perplexity",
                                    "surrogate_quality"} | SEARCH_AND_FIGURES
    assert set(dvc_status(repo)) == {"perplexity@tiny"}
    run(["git", "checkout", "params.yaml"], repo)
    set_param(repo, ["compress", "table", "tolerances"], [0.02])  # not the fine-tune's entries
    assert snakemake_jobs(repo) == {"compress_table", "compress"}
    assert set(dvc_status(repo)) == {"compress"}
    run(["git", "checkout", "params.yaml"], repo)
    set_param(repo, ["search", "budget"], 7)
    assert snakemake_jobs(repo) == SEARCH_AND_FIGURES
    assert set(dvc_status(repo)) == {"search@tiny"}
    # upstream: DVC names the stage whose params changed, Snakemake plans all it feeds
    run(["git", "checkout", "params.yaml"], repo)
    set_param(repo, ["data", "seed"], 7)
    assert snakemake_jobs(repo) == ALL_STAGES
    assert set(dvc_status(repo)) == {"data"}
    # and changing it back is clean again in both
    run(["git", "checkout", "params.yaml"], repo)
    assert snakemake_jobs(repo) == set()
    assert dvc_status(repo) == {}
    # a stage's own subcommands are its code alone: DVC names that stage, not the data stage
    commands = repo / "src" / "hwgptbench" / "surrogate" / "commands.py"
    commands.write_text(commands.read_text() + "# edited\n")
    assert set(dvc_status(repo)) == {"surrogates@tiny"}
    run(["git", "checkout", str(commands)], repo)
    assert dvc_status(repo) == {}


def test_figures_regenerate_from_pulled_tables_alone(pulled: Path) -> None:
    repo = pulled
    figures = repo / "results" / "tiny" / "figures"
    original = {p.name: p.read_bytes() for p in figures.iterdir()}
    shutil.rmtree(figures)
    assert snakemake_jobs(repo) == {"figures_of_scale"}
    run(["snakemake", "figures"], repo)
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == original  # byte-identical
    run(["snakemake", "--report", "results/report.html"], repo)
    report = (repo / "results" / "report.html").read_text()
    assert "hypervolume.png" in report and "pareto_latency.png" in report
    assert snakemake_jobs(repo) == set() and dvc_status(repo) == {}  # as the pull left it


def test_pull_never_blesses_results_of_other_params(pushed: Path, tmp_path: Path) -> None:
    repo = fresh_clone(pushed, tmp_path / "clone")
    set_param(repo, ["sample", "n_archs"], 4)
    result = run(["hwgptbench", "pull"], repo, check=False)
    assert result.returncode == 2
    assert "do not match the current params.yaml" in result.stderr
    assert "sample_archs@tiny" in result.stderr
    assert "sample_archs" in snakemake_jobs(repo)
    assert set(dvc_status(repo)) == {"sample_archs@tiny"}


def test_corrupted_remote_object_is_refused(pushed: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(pushed.parent / "remote", remote)
    shard = pushed / "results" / "data" / "shakespeare" / "train_000.bin"
    digest = hashlib.md5(shard.read_bytes()).hexdigest()
    stored = remote / "files" / "md5" / digest[:2] / digest[2:]
    stored.chmod(0o644)
    raw = bytearray(stored.read_bytes())
    raw[100] ^= 0xFF
    stored.write_bytes(bytes(raw))
    repo = tmp_path / "clone"
    run(["git", "clone", "-q", str(pushed), str(repo)], tmp_path)
    run(["dvc", "remote", "modify", "--local", "local", "url", str(remote)], repo)
    result = run(["dvc", "pull"], repo, check=False)
    assert result.returncode != 0
    assert not (repo / "results" / "data" / "shakespeare" / "train_000.bin").exists()


def device_label(repo: Path) -> str:
    """The label this machine's tables are filed under with the repo's params."""
    return run(["hwgptbench", "devices", "--label"], repo).stdout.strip()


@pytest.mark.slow  # ~4 min: three clones, a measurement, a full dvc repro (-m slow)
def test_campaign_over_two_devices_merges_without_remeasuring(pushed: Path, tmp_path: Path
                                                              ) -> None:
    """Machines A and B each measure and publish their device table; a third clone pulls both
    and fits surrogates for both without measuring anything (docs/measure.md)."""
    machine_a = fresh_clone(pushed, tmp_path / "a")
    run(["hwgptbench", "pull"], machine_a)
    label_a = device_label(machine_a)
    out = run(["hwgptbench", "publish-device", "--scale", "tiny"], machine_a).stdout
    assert f"published {label_a}" in out
    pointer_a = machine_a / "devices" / "tiny" / f"{label_a}.parquet.dvc"
    run(["git", "add", str(pointer_a), str(pointer_a.parent / ".gitignore")], machine_a)
    run(["git", "commit", "-qm", f"measurements of {label_a}"], machine_a)

    remote = pushed.parent / "remote"
    machine_b = fresh_clone(machine_a, tmp_path / "b", remote)
    run(["hwgptbench", "pull"], machine_b, check=False)  # A's new table: measure@tiny is stale
    set_param(machine_b, ["measure", "threads"], 1)  # what a different machine would measure
    label_b = device_label(machine_b)
    assert label_b != label_a
    unmeasured = run(["hwgptbench", "publish-device", "--scale", "tiny"], machine_b, check=False)
    assert unmeasured.returncode != 0 and "measure the device first" in unmeasured.stderr
    table_b = f"results/tiny/measure/{label_b}.parquet"
    assert snakemake_jobs(machine_b, table_b) == {"measure", "measure_device"}
    run(["snakemake", table_b], machine_b)
    run(["hwgptbench", "publish-device", "--scale", "tiny"], machine_b)
    run(["git", "checkout", "params.yaml"], machine_b)
    run(["git", "add", "devices"], machine_b)
    run(["git", "commit", "-qm", f"measurements of {label_b}"], machine_b)

    third = fresh_clone(machine_b, tmp_path / "c", remote)
    set_param(third, ["workflow", "devices"], [])  # measure nothing here
    result = run(["hwgptbench", "pull"], third, check=False)
    assert result.returncode == 2 and "measure@tiny" in result.stderr  # new tables: stale
    assert (third / "devices" / "tiny" / f"{label_b}.parquet").exists()
    planned = snakemake_jobs(third)
    assert not planned & {"measure", "measure_device", "supernet", "perplexity", "data"}
    assert {"measurements", "surrogates_device", "figures_of_scale"} <= planned
    run(["dvc", "repro"], third)
    merged = pl.read_parquet(third / "results" / "tiny" / "measurements.parquet")
    assert set(merged["device"]) == {label_a, label_b}
    assert (third / "results" / "tiny" / "surrogates" / "devices" / label_b).is_dir()
    assert not (third / "results" / "tiny" / ".measure").exists()  # nothing was measured
    assert label_b in (third / "results" / "tiny" / "tables" / "devices.csv").read_text()
    assert snakemake_jobs(third) == set() and dvc_status(third) == {}
