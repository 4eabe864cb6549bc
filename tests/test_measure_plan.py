"""The plan states the memory: group sizes and peaks per scale and device, and a device that
cannot hold the largest arch is refused before any job starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, make_project, run
from hwgptbench import params
from hwgptbench.campaign.budget import GB
from hwgptbench.campaign.plan import (
    COLUMNS,
    DeviceMemory,
    MemoryPlanError,
    check_fits,
    cluster_memory,
    format_table,
    plan_memory,
    plan_scales,
    stand_in_shard,
    tokenizer_vocab_size,
)
from hwgptbench.cli import main
from hwgptbench.params import section_of
from hwgptbench.settings.sections import ClusterSettings, DataSettings, MeasureSettings
from hwgptbench.space import SearchSpace

PARAMS = REPO_ROOT / "params.yaml"
PAPER = REPO_ROOT / "params" / "paper.yaml"


@pytest.fixture(scope="module")
def paper() -> dict:
    """params.yaml with the paper overlay merged over it, as Snakemake merges it."""
    return params.load_overlaid(PARAMS, [PAPER])


def _small_device(tmp_path: Path, gb: float = 4) -> Path:
    overlay = tmp_path / "small.yaml"
    overlay.write_text(yaml.safe_dump({"cluster": {"devices": {"rtx2080": {"memory_gb": gb}}}}))
    return overlay


def test_overlay_merges_mappings_and_replaces_lists() -> None:
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    merged = params.overlay(base, {"a": {"y": [3]}, "c": {"z": 2}})
    assert merged == {"a": {"x": 1, "y": [3]}, "b": 1, "c": {"z": 2}}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}


def test_paper_overlay_plans_every_scale_and_device_within_memory(paper: dict) -> None:
    measure = section_of(MeasureSettings, paper["measure"])
    devices = cluster_memory(section_of(ClusterSettings, paper["cluster"]), measure.aliases)
    assert set(devices) == set(paper["cluster"]["devices"])  # every device states its memory
    assert not devices["cpu-epyc-7502"].gpu and devices["a100"].gpu
    spaces = [SearchSpace.from_dict(scale, paper["spaces"][scale])
              for scale in paper["workflow"]["scales"]]
    vocab = tokenizer_vocab_size(section_of(DataSettings, paper["data"]).tokenizer)
    assert vocab == 50304
    plans = plan_scales(spaces, measure, paper["sample"]["n_archs"] + 2, vocab, devices)
    print(format_table(plans))
    assert len(plans) == len(paper["workflow"]["scales"]) * len(devices)
    for plan in plans:
        assert plan.largest <= plan.memory, plan
        assert plan.budget == int(0.6 * plan.memory)  # memory_budget_gb null: 60%
        assert plan.archs_per_shard == 501  # 10 002 archs over 20 shards
        assert 1 <= plan.group_size <= plan.archs_per_shard and plan.groups >= 1
    cpu = [p for p in plans if p.device == "cpu-epyc-7502" and p.scale == "s"]
    assert cpu[0].groups == 1 and "cuda_graph" not in cpu[0].condition  # no graphs on CPUs


def test_device_with_too_little_memory_is_refused(paper: dict) -> None:
    space = SearchSpace.from_dict("s", paper["spaces"]["s"])
    with pytest.raises(MemoryPlanError) as error:
        check_fits(space, section_of(MeasureSettings, paper["measure"]), 50304, "rtx2080",
                   DeviceMemory(4 * GB, True))
    message = str(error.value)
    for part in ("scale s", "device rtx2080", "4.8 GiB at b8-t1024-fp32", "4.0 GiB",
                 "measure.batch_sizes", "drop rtx2080 from workflow.devices"):
        assert part in message


def test_budget_and_stand_in_shard() -> None:
    config = params.load(PARAMS)
    space = SearchSpace.from_dict("tiny", config["spaces"]["tiny"])
    shard = stand_in_shard(space, 40)
    assert len(shard) == len(set(shard)) == 40 and shard[0] == space.largest()
    section = section_of(MeasureSettings, {**config["measure"], "memory_budget_gb": 0.001})
    plan = plan_memory(space, section, 102, 4096, "here", DeviceMemory(8 * GB, False))
    assert plan.budget == int(0.001 * GB)
    # the budget holds one arch and no anchor besides it: a group per arch
    assert plan.groups == 102 and plan.group_size == 1
    roomy = plan_memory(space, section_of(MeasureSettings, config["measure"]), 102, 4096, "here",
                        DeviceMemory(8 * GB, False))
    assert roomy.groups == 1 and roomy.group_size == 102 and roomy.peak < roomy.budget


def test_a_peak_over_the_budget_is_marked_and_named_with_its_fix() -> None:
    config = params.load(PARAMS)
    space = SearchSpace.from_dict("tiny", config["spaces"]["tiny"])
    section = section_of(MeasureSettings, {**config["measure"], "memory_budget_gb": 0.001})
    plan = plan_memory(space, section, 102, 4096, "here", DeviceMemory(8 * GB, False))
    assert plan.peak > plan.budget and plan.over_budget == plan.peak_groups == 102
    assert plan.row()[COLUMNS.index("planned peak GB")].endswith(" *")
    warning = plan.over_budget_warning()
    assert warning is not None
    for part in ("scale tiny, device here: 102 of 102 groups at ", "against 0.0 GiB",
                 "no smaller group exists", "tried anyway", "memory_budget_gb to at least 0.1",
                 "measure.batch_sizes"):
        assert part in warning, warning
    assert format_table([plan]).splitlines()[-1].startswith("* planned peak over budget_gb")
    roomy = plan_memory(space, section_of(MeasureSettings, config["measure"]), 102, 4096, "here",
                        DeviceMemory(8 * GB, False))
    assert roomy.over_budget_warning() is None and not roomy.row()[7].endswith("*")
    assert len(format_table([roomy]).splitlines()) == 2


def test_cli_prints_the_plan_and_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "plan.txt"
    with caplog.at_level("WARNING"):
        assert main(["measure-plan", "--params", str(PARAMS), "--overlay", str(PAPER),
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    lines = printed.splitlines()
    assert lines[0].split()[:4] == ["scale", "device", "memory_gb", "budget_gb"]
    assert sum(line.startswith(("s ", "m ", "l ")) for line in lines) == 3 * 13
    # the paper's l archs on the 10-11 GiB GPUs: the largest (8.1 GiB) is over a 60% budget
    over = {tuple(line.split()[:2]) for line in lines if " * " in line}
    assert over == {("l", "rtx2080"), ("l", "rtx3080"), ("m", "rtx3080")}
    assert lines[-1].startswith("* planned peak over budget_gb")
    warnings = [r.getMessage() for r in caplog.records if "than the budget" in r.getMessage()]
    assert len(warnings) == 3
    (l_2080,) = [w for w in warnings if w.startswith("scale l, device rtx2080: ")]
    assert "up to 8.1 GiB against 6.6 GiB" in l_2080 and "at least 8.1" in l_2080
    assert main(["measure-plan", "--params", str(PARAMS)]) == 0  # no cluster: this machine
    here = capsys.readouterr().out.splitlines()
    assert len(here) == 2 and here[1].startswith("tiny ")


def test_cli_refuses_a_device_too_small(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure-plan", "--params", str(PARAMS), "--overlay", str(PAPER),
                 str(_small_device(tmp_path))]) == 2
    assert "measure-plan: error: scale s, device rtx2080" in capsys.readouterr().err


@pytest.mark.e2e
def test_workflow_refuses_a_device_too_small_before_any_job(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    result = run(["snakemake", "--configfile", "params/paper.yaml",
                  str(_small_device(tmp_path)), "-n"], project, check=False)
    assert result.returncode != 0
    assert "measure plan refused: scale s, device rtx2080" in result.stdout + result.stderr
    assert not (project / "results" / "s").exists()
