"""Supernet training under torchrun (DDP, gloo on CPU) is the single-process run: the batch is
global and split over the ranks, the loss table is that of the whole batch, and the workflow
launches torchrun when supernet.processes > 1."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from conftest import BIN, REPO_ROOT, make_project, run
from hwgptbench import params
from hwgptbench.outputs import MARKER
from hwgptbench.params import section_of
from hwgptbench.settings.sections import SupernetSettings
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train

DEFAULT = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
TINY = SearchSpace.from_dict("tiny", DEFAULT["spaces"]["tiny"])
SUPERNET = {"steps": 4, "batch_size": 4, "checkpoint_every": 2, "snapshots": [3],
            "device": "cpu", "processes": 2}

# Measured on a 2-core CPU with these params: 2 ranks vs 1 process differ by at most 7.0e-8 in
# any weight and 1.9e-6 in any loss (float summation order). Ranks that each draw their own
# windows (a different computation) differ by 2.1e-4 and 1.9e-2. The tolerances sit ~15x and
# ~50x above the first and ~200x below the second.
WEIGHT_TOLERANCE = 1e-6
LOSS_TOLERANCE = 1e-4


def _params(supernet: dict[str, object]) -> dict:
    doc = copy.deepcopy(DEFAULT)
    doc["supernet"].update(supernet)
    return doc


@pytest.mark.e2e
def test_two_ranks_train_what_one_process_trains(shakespeare: Path, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    doc = _params(SUPERNET)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "hwgptbench.cli",
         "train", "--params", "params.yaml", "--data", str(shakespeare), "--scale", "tiny",
         "--out", "out", "--work-dir", "work"], tmp_path)
    two_ranks_s = time.monotonic() - started
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != MARKER) == [
        "loss.parquet", "supernet-step-3.pt", "supernet.pt"]
    assert sorted(p.name for p in (tmp_path / "work").iterdir() if p.name != MARKER) == [
        "checkpoint.pt", "supernet-step-3.pt"]
    assert torch.load(tmp_path / "work" / "checkpoint.pt", weights_only=False)["step"] == 4

    # the same params in one process: warns that it is not supernet.processes, same result
    cfg = section_of(SupernetSettings, doc["supernet"])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hwgptbench.training.train"):
        train.train(cfg, TINY, TokenShards.open(shakespeare), tmp_path / "one",
                    tmp_path / "one_work")
    one_process_s = time.monotonic() - started
    assert "training with 1 process(es) while supernet.processes is 2" in caplog.text

    weight_diff = {}
    for name in ("supernet.pt", "supernet-step-3.pt"):
        two = torch.load(tmp_path / "out" / name, weights_only=False)
        one = torch.load(tmp_path / "one" / name, weights_only=False)
        assert two["fingerprint"] == one["fingerprint"] and two["steps"] == one["steps"]
        assert two["model"].keys() == one["model"].keys()
        weight_diff[name] = max(float((two["model"][k] - one["model"][k]).abs().max())
                                for k in one["model"])
    loss_two = pl.read_parquet(tmp_path / "out" / train.LOSS_TABLE)
    loss_one = pl.read_parquet(tmp_path / "one" / train.LOSS_TABLE)
    assert loss_two.drop("loss").equals(loss_one.drop("loss"))
    loss_diff = float((loss_two["loss"] - loss_one["loss"]).abs().max())
    measured = (f"max abs diff 2 ranks vs 1 process: weights {weight_diff}, losses "
                f"{loss_diff:.3g}; 2 ranks {two_ranks_s:.1f} s, 1 process {one_process_s:.1f} s")
    logging.getLogger(__name__).info(measured)
    assert max(weight_diff.values()) <= WEIGHT_TOLERANCE and loss_diff <= LOSS_TOLERANCE, measured


def test_checkpoint_resumes_under_another_process_count(shakespeare: Path) -> None:
    cfg = section_of(SupernetSettings, _params(SUPERNET)["supernet"])
    shards = TokenShards.open(shakespeare)
    assert (train.run_fingerprint(cfg, TINY, shards)
            == train.run_fingerprint(replace(cfg, processes=1), TINY, shards))


def test_rank_takes_its_share_of_the_global_batch(shakespeare: Path) -> None:
    sampler = train.WindowSampler(TokenShards.open(shakespeare).split("train"), 32)
    x, y = sampler.sample(train.step_rng(1, 2, 0), 6)
    shares = [train.Distributed(rank, rank, 3).rows(6) for rank in range(3)]
    assert shares == [slice(0, 2), slice(2, 4), slice(4, 6)]
    for share in shares:
        x_share, y_share = sampler.sample(train.step_rng(1, 2, 0), 6, share)
        assert torch.equal(x_share, x[share]) and torch.equal(y_share, y[share])
    with pytest.raises(ValueError, match=r"batch_size \(6\) is not divisible by the 4"):
        train.Distributed(0, 0, 4).rows(6)


@pytest.mark.parametrize(("batch_size", "processes", "expected"), [
    (6, 4, "supernet.batch_size: 6 is not divisible by supernet.processes (4)"),
    (6, 4, "set supernet.batch_size to a multiple of 4 (e.g. 4 or 8)"),
    (3, 4, "(e.g. 4) or supernet.processes to a divisor of 3"),
])
def test_batch_size_must_divide_over_processes(batch_size: int, processes: int, expected: str
                                               ) -> None:
    doc = _params({"batch_size": batch_size, "processes": processes})
    with pytest.raises(params.ParamsError) as info:
        params.validate(doc)
    assert expected in str(info.value)
    with pytest.raises(params.ParamsError, match="supernet.processes"):
        section_of(SupernetSettings, doc["supernet"])
    assert params.validate(_params({"batch_size": 8, "processes": 4}))


@pytest.mark.e2e
def test_workflow_launches_torchrun_for_several_processes(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    for processes, expected in [
            (2, "torchrun --standalone --nproc_per_node 2 -m hwgptbench.cli train --scale tiny"),
            (1, "hwgptbench train --scale tiny")]:
        (project / "params.yaml").write_text(yaml.safe_dump(_params({"processes": processes})))
        result = run(["snakemake", "-n", "-p", "results/tiny/supernet/supernet.pt"], project)
        command = next(line for line in result.stdout.splitlines()
                       if " train --scale tiny" in line)
        assert expected in command and ("torchrun" in command) == (processes > 1), command
