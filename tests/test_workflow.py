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

import docs_examples
from conftest import REPO_ROOT, make_project, run, set_param, tool_env, use_test_params
from hwgptbench.pipeline.dvc_deps import dvc_stages, under
from tracing.reader import StageReads, stage_reads, traced_env

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
    traces = repo.parent / "traces"  # what each process of the run loaded and read
    traces.mkdir()
    run(["dvc", "repro"], repo, env=traced_env(tool_env(), traces))
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
    # at one glance: the workflow is current, the paper's pipeline (`make paper`) not built
    assert run(["hwgptbench", "status"], repo).stdout.splitlines() == [
        "dvc.yaml: current (14 stages)", "paper/dvc.yaml: not built (make paper builds it)"]
    run(["dvc", "push"], repo)
    run(["git", "add", "dvc.lock"], repo)
    run(["git", "commit", "-qm", "results"], repo)
    return repo


@pytest.fixture(scope="module")
def reads(pushed: Path) -> StageReads:
    """What the processes of each DVC stage of the pushed run loaded and read (tests/tracing/:
    a trace that every Python process of the run wrote, independent of the package)."""
    tracked = set(run(["git", "ls-files"], pushed).stdout.split())
    commands = {stage.name: (stage.target,) for stage in dvc_stages(pushed)}
    return stage_reads(pushed.parent / "traces", commands, [pushed, REPO_ROOT], tracked)


def test_code_deps_cover_what_every_command_loaded(reads: StageReads) -> None:
    """The modules each command of the whole run really loaded (its trace) are in the code
    that `hwgptbench.pipeline.code_closure` derives for it from the imports, from which the
    stages' deps and the rules' code listings are written."""
    from hwgptbench.pipeline.code_closure import PACKAGE, closure, handler_modules

    assert {"data", "train", "measure", "search", "figures", "compress-table"} <= set(
        reads.commands)
    for command, loaded in reads.commands.items():
        derived = handler_modules(command) | closure({f"{PACKAGE}.cli"})
        missed = loaded - derived
        assert not missed, f"{command} loaded {sorted(missed)}, which its derived code misses"


def changed(value: object) -> object:
    """Another value of the same kind (a mapping gains a key)."""
    if isinstance(value, dict):
        return {**value, "mutated": True}
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, "mutated"]
    return f"{value}-mutated" if isinstance(value, str) else "mutated"


def named_by_status(repo: Path) -> dict[str, set[str]]:
    """Stage -> the deps (paths) and params keys that `dvc status` says changed."""
    named: dict[str, set[str]] = {}
    for stage, entries in dvc_status(repo).items():
        for entry in entries:
            for path, what in (entry.get("changed deps", {}) if isinstance(entry, dict)
                               else {}).items():
                named.setdefault(stage, set()).update(what if isinstance(what, dict) else [path])
    return named


def section_named(section: str, keys: set[str]) -> bool:
    return any(k == section or k.startswith(section + ".") or section.startswith(k + ".")
               for k in keys)


def test_a_change_to_anything_a_stage_ran_makes_that_stage_stale(
        pulled: Path, reads: StageReads) -> None:
    """Proven by mutation: every project file that a stage's processes loaded or read (its
    trace) edited at once in the pulled clone, and every params section that its commands
    read changed, `dvc status` names each stage for each of them: its own deps cover them,
    whatever a stage upstream of it lists (DVC reruns a stage only when its own deps
    change; an upstream stage may rerun and write the same bytes)."""
    repo = pulled
    files = {file for stage_files in reads.files.values() for file in stage_files}
    shared = {"src/hwgptbench/metrics.py", "src/hwgptbench/space.py",
              "src/hwgptbench/meters/condition.py", "src/hwgptbench/model/gpt.py",
              "src/hwgptbench/search_algorithms.py", "src/hwgptbench/settings/sections.py",
              "src/hwgptbench/settings/document.py", "workflow/Snakefile",
              "workflow/rules/search.smk"}
    assert shared <= files, sorted(shared - files)
    assert {"measure@tiny", "surrogates@tiny", "search@tiny"} <= {
        stage for stage, stage_files in reads.files.items()
        if "src/hwgptbench/metrics.py" in stage_files}
    doc = yaml.safe_load((repo / "params.yaml").read_text())
    sections = {section for read in reads.sections.values() for section in read}
    assert {"measure", "search", "data"} <= sections
    for section in sections:
        *above, key = section.split(".")
        node = doc
        for part in above:
            node = node[part]
        node[key] = changed(node[key])
    try:
        (repo / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        for file in files:
            with open(repo / file, "a", encoding="utf-8") as handle:
                handle.write("\n")
        named = named_by_status(repo)
    finally:
        run(["git", "checkout", "--", "."], repo)
    missed = [f"{stage}: {file}" for stage, stage_files in sorted(reads.files.items())
              for file in sorted(stage_files)
              if not any(under(file, dep) for dep in named.get(stage, ()))]
    assert not missed, "edited, and dvc status does not name the stage that ran it:\n" + (
        "\n".join(missed))
    missed = [f"{stage}: {section}" for stage, read in sorted(reads.sections.items())
              for section in sorted(read) if not section_named(section, named.get(stage, set()))]
    assert not missed, "changed, and dvc status does not name the stage that read it:\n" + (
        "\n".join(missed))
    assert dvc_status(repo) == {}


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
    # the search commands read the surrogate section too (the family they query)
    assert set(dvc_status(repo)) == {"surrogates@tiny", "search@tiny"}
    # a search space that is not run changes nothing
    set_param(repo, ["spaces", "s", "n_layer"], [10, 12])
    assert set(dvc_status(repo)) == {"surrogates@tiny", "search@tiny"}
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
    # a stage's own subcommands are its code alone: DVC names that stage, not the data stage,
    # and Snakemake plans its rules (their code fingerprints changed) and what they feed
    commands = repo / "src" / "hwgptbench" / "surrogate" / "commands.py"
    commands.write_text(commands.read_text() + "# edited\n")
    assert set(dvc_status(repo)) == {"surrogates@tiny"}
    assert snakemake_jobs(repo) == {"surrogates_perplexity", "surrogates_device",
                                    "surrogate_quality"} | SEARCH_AND_FIGURES
    run(["git", "checkout", str(commands)], repo)
    assert dvc_status(repo) == {}
    assert snakemake_jobs(repo) == set()
    # code that several stages run: each of them is stale in both tools
    metrics = repo / "src" / "hwgptbench" / "metrics.py"
    metrics.write_text(metrics.read_text() + "# edited\n")
    assert {"measure@tiny", "surrogates@tiny", "search@tiny"} <= set(dvc_status(repo))
    assert {"measure", "surrogates_device", "search"} <= snakemake_jobs(repo)
    run(["git", "checkout", str(metrics)], repo)
    assert dvc_status(repo) == {} and snakemake_jobs(repo) == set()


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


@pytest.fixture(scope="module")
def finished(pulled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the pulled run for the documents' examples to write into (its DVC cache is
    the pulled clone's, linked)."""
    copy = tmp_path_factory.mktemp("docs") / "clone"
    shutil.copytree(pulled, copy, symlinks=True, ignore=lambda folder, names: (
        ["cache"] if Path(folder) == pulled / ".dvc" else []))
    (copy / ".dvc" / "cache").symlink_to(pulled / ".dvc" / "cache")
    return copy


@pytest.mark.parametrize("group", docs_examples.params({"e2e", "e2e-slow"}))
def test_doc_examples_on_the_finished_run(group: docs_examples.Group, finished: Path,
                                          pulled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples of README.md and docs/*.md that read a finished run (marked e2e:
    tests/docs_examples.py), a section at a time, in the copy of the pulled run, which holds
    what the pull left again after each section."""
    try:
        docs_examples.run_group(group, finished, monkeypatch,
                                900 if group.where == "e2e-slow" else 200)
    finally:
        docs_examples.restore(finished, pulled)
