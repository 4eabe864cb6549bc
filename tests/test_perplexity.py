"""Sampled archs and their perplexity with inherited weights."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import torch

from conftest import REPO_ROOT, run
from hwgptbench.evaluation import perplexity
from hwgptbench.model import SuperGPT
from hwgptbench.space import SearchSpace, read_archs_from
from hwgptbench.supernet import archs
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})


def test_sample_table_has_ends_and_distinct_sampled_archs() -> None:
    table = archs.sample_table(SPACE, 20, seed=3, vocab_size=100)
    assert table["kind"][:2].to_list() == ["smallest", "largest"]
    assert table.filter(pl.col("kind") == "sampled").height == 20
    assert table["arch_id"].n_unique() == 22
    assert table.equals(archs.sample_table(SPACE, 20, seed=3, vocab_size=100))
    ids = archs.sample_table(SPACE, 20, seed=4, vocab_size=100)["arch_id"].to_list()
    assert ids != table["arch_id"].to_list()
    for arch, count in zip(read_archs_from(table), table["params"], strict=True):
        assert SPACE.n_params(arch, 100) == count


def test_validation_batches_are_fixed_by_seed(shakespeare: Path) -> None:
    val = TokenShards.open(shakespeare).split("val")
    a = perplexity.validation_batches(val, 32, 3, 4, seed=1)
    b = perplexity.validation_batches(val, 32, 3, 4, seed=1)
    assert all(torch.equal(xa, xb) for (xa, _), (xb, _) in zip(a, b, strict=True))


def test_inherited_perplexity_equals_the_extracted_model(shakespeare: Path) -> None:
    shards = TokenShards.open(shakespeare)
    torch.manual_seed(0)
    model = SuperGPT(SPACE, shards.manifest["tokenizer"]["vocab_size"])
    batches = perplexity.validation_batches(shards.split("val"), 32, 2, 4, seed=1)
    chosen = [SPACE.smallest(), SPACE.largest(), *SPACE.sample(3, seed=2)]
    table = perplexity.evaluate(model, chosen, batches, torch.device("cpu"))
    assert table["arch_id"].to_list() == [a.id for a in chosen]
    for arch, loss, ppl in zip(chosen, table["val_loss"], table["perplexity"], strict=True):
        fixed = model.extract(arch).eval()
        with torch.no_grad():
            expected = sum(float(fixed(x, y)[1]) for x, y in batches) / len(batches)
        assert math.isclose(loss, expected, rel_tol=1e-5)
        assert math.isclose(ppl, math.exp(loss))


def test_cli_sample_and_perplexity(shakespeare: Path, tmp_path: Path) -> None:
    """The stage commands as the workflow calls them, on a supernet trained for 2 steps with a
    snapshot after 1: one row per arch and fidelity, on the same validation batches."""
    import yaml

    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    doc["supernet"].update(steps=2, batch_size=2, checkpoint_every=1, device="cpu",
                           snapshots=[1])
    doc["sample"]["n_archs"] = 4
    doc["perplexity"].update(batches=1, batch_size=2, device="cpu")
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(doc))
    common = ["--params", str(params_file), "--data", str(shakespeare), "--scale", "tiny"]
    run(["hwgptbench", "train", *common, "--out", "sn", "--work-dir", "w"], tmp_path)
    run(["hwgptbench", "sample", *common, "--out", "archs.parquet"], tmp_path)
    run(["hwgptbench", "perplexity", *common, "--supernet", "sn/supernet.pt",
         "--archs", "archs.parquet", "--out", "ppl.parquet"], tmp_path)
    table = pl.read_parquet(tmp_path / "ppl.parquet")
    assert table.columns == ["arch_id", "params", "train_steps", "val_loss", "perplexity"]
    assert table.height == 12 and table["perplexity"].min() > 1
    ids = pl.read_parquet(tmp_path / "archs.parquet")["arch_id"].to_list()
    losses = {}
    for steps, path in [(1, "sn/supernet-step-1.pt"), (2, "sn/supernet.pt")]:
        rows = table.filter(pl.col("train_steps") == steps)
        assert rows["arch_id"].to_list() == ids
        model, space = train.load_supernet(tmp_path / path)
        batches = perplexity.validation_batches(TokenShards.open(shakespeare).split("val"),
                                                space.block_size, 1, 2, doc["perplexity"]["seed"])
        expected = perplexity.evaluate(model, read_archs_from(rows), batches,
                                       torch.device("cpu"))
        losses[steps] = rows["val_loss"].to_list()
        assert losses[steps] == expected["val_loss"].to_list()
    assert losses[1] != losses[2]
    bad = run(["hwgptbench", "sample", *common[:-1], "xl", "--out", "x.parquet"], tmp_path,
              check=False)
    assert bad.returncode == 2 and "unknown scale 'xl'" in bad.stderr
