"""Supernet training under torchrun (DDP, gloo on CPU): the launcher users already have."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from conftest import BIN, REPO_ROOT, run


@pytest.mark.slow
def test_torchrun_two_ranks_trains_and_only_rank0_writes(shakespeare: Path, tmp_path: Path
                                                          ) -> None:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    doc["supernet"].update(steps=4, batch_size=2, checkpoint_every=2, snapshots=[3],
                           device="cpu")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "hwgptbench.cli",
         "train", "--params", "params.yaml", "--data", str(shakespeare), "--scale", "tiny",
         "--out", "out", "--work-dir", "work"], tmp_path)
    state = torch.load(tmp_path / "out" / "supernet.pt", weights_only=False)
    assert state["steps"] == 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "loss.parquet", "supernet-step-3.pt", "supernet.pt"]
    assert torch.load(tmp_path / "work" / "checkpoint.pt", weights_only=False)["step"] == 4
