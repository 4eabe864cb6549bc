"""The paper-scale configuration: params/paper.yaml plans the full DAG in seconds."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, make_project, run

PAPER = yaml.safe_load((REPO_ROOT / "params" / "paper.yaml").read_text())


def job_counts(dry_run: str) -> Counter[str]:
    """Jobs per rule from the 'Job stats' table of a Snakemake dry run."""
    table = dry_run.split("Job stats:")[1].strip().split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()[2:]]
    return Counter({rule: int(count) for rule, count in rows if rule != "total"})


@pytest.mark.e2e
def test_paper_dag_plans_every_scale_device_and_search_in_seconds(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    start = time.perf_counter()
    out = run(["snakemake", "--configfile", "params/paper.yaml", "-n"], project).stdout
    seconds = time.perf_counter() - start
    scales = len(PAPER["workflow"]["scales"])
    devices = len(PAPER["workflow"]["devices"])
    assert devices == 13 and devices == len(PAPER["cluster"]["devices"])
    algorithms = yaml.safe_load((project / "params.yaml").read_text())["search"]["algorithms"]
    searches = (len(PAPER["search"]["objectives"]) * len(PAPER["search"]["devices"])
                * len(algorithms))
    counts = job_counts(out)
    assert counts["supernet"] == counts["perplexity"] == scales
    assert counts["measure"] == scales * devices * PAPER["measure"]["shards"]
    assert counts["measure_device"] == counts["surrogates_device"] == scales * devices
    assert counts["runtime"] == scales * devices and counts["runtime_merged"] == scales
    assert counts["search"] == scales * searches
    assert counts["figures_of_scale"] == scales
    # ~3 s measured on 2 cores (README); the bound catches a DAG that grows per arch or seed
    assert seconds < 20, f"paper-scale dry run took {seconds:.1f} s"
