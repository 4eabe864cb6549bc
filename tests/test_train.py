"""Sandwich-rule supernet training: schedule, sub-network choice, exact resume, snapshots."""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from pathlib import Path

import polars as pl
import pytest
import torch

from hwgptbench.io import TorchFileError
from hwgptbench.outputs import MARKER
from hwgptbench.params import ParamsError, section_of
from hwgptbench.settings.sections import SupernetSettings, TrainingSettings
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train

SMALL_SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})

CONFIG = TrainingSettings(steps=6, batch_size=4, random_subnets=1, lr=3e-3, betas=(0.9, 0.98),
                          weight_decay=0.1, warmup_steps=2, min_lr_ratio=0.1, grad_clip=1.0,
                          checkpoint_every=3, device="cpu", seed=5, snapshots=(2,), processes=1)


def test_lr_schedule_warms_up_then_decays_to_floor() -> None:
    cfg = replace(CONFIG, steps=100, warmup_steps=10)
    factors = [train.lr_factor(s, cfg) for s in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert factors[100] == pytest.approx(cfg.min_lr_ratio)


def test_sandwich_is_smallest_randoms_largest_and_seeded() -> None:
    archs = train.sandwich(SMALL_SPACE, 3, seed=1, step=7)
    assert archs[0] == SMALL_SPACE.smallest() and archs[-1] == SMALL_SPACE.largest()
    assert len(archs) == 5
    assert archs == train.sandwich(SMALL_SPACE, 3, seed=1, step=7)
    assert archs != train.sandwich(SMALL_SPACE, 3, seed=1, step=8)


def test_windows_are_shifted_and_seeded(shakespeare: Path) -> None:
    sampler = train.WindowSampler(TokenShards.open(shakespeare).split("train"), 32)
    x, y = sampler.sample(train.step_rng(1, 2), 4)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, sampler.sample(train.step_rng(1, 2), 4)[0])


def _states_equal(a: Path, b: Path) -> None:
    _weights_equal(torch.load(a, weights_only=True)["model"],
                   torch.load(b, weights_only=True)["model"])


def _weights_equal(state_a: dict[str, torch.Tensor], state_b: dict[str, torch.Tensor]) -> None:
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


def test_resume_gives_identical_weights(shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    straight = train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "a", tmp_path / "a_work")
    assert train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "b", tmp_path / "b_work",
                       stop_after=3) is None
    assert not (tmp_path / "b" / train.SUPERNET).exists()
    assert torch.load(tmp_path / "b_work" / train.CHECKPOINT, weights_only=True)["step"] == 3
    snapshot = train.snapshot_name(2)
    assert (tmp_path / "b_work" / snapshot).exists()  # taken before the kill at step 3
    resumed = train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "b", tmp_path / "b_work")
    _states_equal(straight, resumed)
    _states_equal(tmp_path / "a" / snapshot, tmp_path / "b" / snapshot)
    loss_a = pl.read_parquet(tmp_path / "a" / train.LOSS_TABLE)
    loss_b = pl.read_parquet(tmp_path / "b" / train.LOSS_TABLE)
    assert loss_a.equals(loss_b)
    assert loss_a.height == CONFIG.steps * (CONFIG.random_subnets + 2)
    assert set(loss_a["kind"]) == {"smallest", "random", "largest"}


def test_checkpoint_of_other_params_is_not_resumed(shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "x", tmp_path / "work", stop_after=3)
    other = replace(CONFIG, seed=6)
    fresh = train.train(other, SMALL_SPACE, shards, tmp_path / "y", tmp_path / "fresh_work")
    reused = train.train(other, SMALL_SPACE, shards, tmp_path / "x", tmp_path / "work")
    _states_equal(fresh, reused)


def test_load_supernet_round_trip(shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    path = train.train(replace(CONFIG, steps=2, snapshots=(1,)), SMALL_SPACE, shards,
                       tmp_path / "o", tmp_path / "w")
    files = train.supernet_files(path)
    assert files == {1: tmp_path / "o" / train.snapshot_name(1), 2: path}
    for file in files.values():
        model, space = train.load_supernet(file)
        assert space == SMALL_SPACE
        x = torch.zeros(1, 8, dtype=torch.int64)
        model.set_arch(SMALL_SPACE.smallest())
        assert model(x).shape == (1, 8, shards.manifest["tokenizer"]["vocab_size"])


def test_snapshot_is_the_model_at_its_step(shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    cfg = replace(CONFIG, checkpoint_every=2, snapshots=(2, 4))
    train.train(cfg, SMALL_SPACE, shards, tmp_path / "killed", tmp_path / "kw", stop_after=4)
    checkpoint = torch.load(tmp_path / "kw" / train.CHECKPOINT, weights_only=True)
    assert checkpoint["step"] == 4
    final = train.train(cfg, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w")
    snapshot = torch.load(tmp_path / "o" / train.snapshot_name(4), weights_only=True)
    _weights_equal(snapshot["model"], checkpoint["model"])
    assert snapshot["steps"] == 4 and snapshot["format"] == train.FORMAT
    assert snapshot["fingerprint"] == torch.load(final, weights_only=True)["fingerprint"]
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.name != MARKER) == [
        "loss.parquet", "supernet-step-2.pt", "supernet-step-4.pt", "supernet.pt"]
    # a rerun with fewer snapshots drops the others from the output folder
    train.train(replace(cfg, snapshots=(2,)), SMALL_SPACE, shards, tmp_path / "o",
                tmp_path / "w")
    assert not (tmp_path / "o" / train.snapshot_name(4)).exists()


def test_resume_without_its_snapshot_says_how_to_recover(shakespeare: Path, tmp_path: Path
                                                         ) -> None:
    shards = TokenShards.open(shakespeare)
    train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w", stop_after=3)
    (tmp_path / "w" / train.snapshot_name(2)).unlink()
    with pytest.raises(RuntimeError, match="snapshot of step 2.*delete .*checkpoint.pt"):
        train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w")


def test_truncated_checkpoint_names_the_file_and_the_way_out(shakespeare: Path, tmp_path: Path
                                                             ) -> None:
    shards = TokenShards.open(shakespeare)
    train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w", stop_after=3)
    checkpoint = tmp_path / "w" / train.CHECKPOINT
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    with pytest.raises(TorchFileError,
                       match=f"{checkpoint} cannot be read .*delete it and rerun: training "
                             "restarts from step 0"):
        train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w")
    checkpoint.unlink()  # as the message says: the rerun trains from step 0
    assert train.train(CONFIG, SMALL_SPACE, shards, tmp_path / "o", tmp_path / "w").exists()


def test_a_supernet_file_is_read_as_data_only(tmp_path: Path) -> None:
    """A pulled or given file that would run code when unpickled is refused, with the fix."""
    path = tmp_path / train.SUPERNET
    torch.save({"format": train.FORMAT, "steps": 1, "payload": print}, path)
    with pytest.raises(TorchFileError, match=f"{path} cannot be read .*asks for print, an "
                                                   "object other than tensors.*refused unread"
                                                   ".*make pull"):
        train.read_supernet_file(path)
    path.write_bytes(b"not a torch file")
    with pytest.raises(TorchFileError, match="corrupt or truncated.*make pull"):
        train.read_supernet_file(path)


@pytest.mark.parametrize(("snapshots", "message"), [
    ((2, 6), r"supernet.snapshots: \[2, 6\].*< supernet.steps \(6\): drop \[6\]"),
    ((4, 2), r"supernet.snapshots: \[4, 2\].*increasing order, e.g. \[2, 4\]"),
])
def test_config_checks_snapshots_against_steps(snapshots: tuple[int, ...], message: str
                                               ) -> None:
    with pytest.raises(ParamsError, match=message):
        section_of(SupernetSettings, asdict(CONFIG) | {"betas": list(CONFIG.betas),
                                              "snapshots": list(snapshots)})
