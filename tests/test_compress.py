"""The compression stages on real data: dense pretraining, import and fine-tune with resume,
search of sub-networks evaluated for real, and the dense-vs-found-vs-quantized table."""

from __future__ import annotations

import copy
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from conftest import REPO_ROOT
from hwgptbench.compress.dense import pretrain
from hwgptbench.compress.evaluate import SubnetEvaluator
from hwgptbench.compress.figures import compression_figure, search_edge
from hwgptbench.compress.finetune import IMPORTANCE_TABLE, calibration_batches, finetune
from hwgptbench.compress.importance import reorder, unit_importance
from hwgptbench.compress.recovery import recover
from hwgptbench.compress.search import run_searches, subnet_table
from hwgptbench.compress.table import FAIR_REFERENCE, BaselinePlan, compression_table, picks
from hwgptbench.evaluation.perplexity import validation_batches
from hwgptbench.evaluation.tasks import build_cloze
from hwgptbench.model.dense import load_dense
from hwgptbench.params import section_of
from hwgptbench.settings.compress import (
    CompressSettings,
    ImportanceSettings,
    SubnetSearchSettings,
    TimingSettings,
)
from hwgptbench.settings.sections import TrainingSettings
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training.train import WindowSampler, load_supernet

SECTION = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["compress"]
SPACE = SECTION["space"] | {"embed_dim": [32], "n_layer": [1, 2], "n_head": [2, 4],
                            "mlp_ratio": [1, 2], "head_size": 8, "block_size": 32}
TIMING = TimingSettings.parse(SECTION["timing"] | {
    "seq_len": 32, "warmup": 1, "min_repeats": 2, "max_repeats": 3, "max_seconds": 0.01})


def training(steps: int, **changes: object) -> TrainingSettings:
    return section_of(CompressSettings, {"finetune": SECTION["finetune"] | {
        "steps": steps, "batch_size": 2, "checkpoint_every": 1, "warmup_steps": 1,
        "device": "cpu"} | changes}).finetune


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return SearchSpace.from_dict("compress_test", SPACE)


@pytest.fixture(scope="module")
def dense_file(space: SearchSpace, shakespeare: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    out = tmp_path_factory.mktemp("dense")
    pretrain(space, training(4, random_subnets=0, lr=1e-2), TokenShards.open(shakespeare),
             out / "dense.pt", out / "work")
    return out / "dense.pt"


IMPORTANCE = ImportanceSettings(enabled=True, batches=1, batch_size=2, seed=0)
FINETUNES = ("supernet", "none", "equal")


def test_pretrained_dense_model_is_the_largest_arch(space: SearchSpace, dense_file: Path
                                                    ) -> None:
    dense = load_dense(dense_file)
    assert dense.config.arch == space.largest() and dense.config.family == "llama"


def test_finetune_resumes_exactly_and_starts_from_the_dense_model(
        space: SearchSpace, dense_file: Path, shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    straight = finetune(dense_file, space, training(3), shards, IMPORTANCE, tmp_path / "a",
                        tmp_path / "wa")
    assert finetune(dense_file, space, training(3), shards, IMPORTANCE, tmp_path / "b",
                    tmp_path / "wb", stop_after=2) is None
    resumed = finetune(dense_file, space, training(3), shards, IMPORTANCE, tmp_path / "b",
                       tmp_path / "wb")
    a, b = (load_supernet(p)[0].state_dict() for p in (straight, resumed))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0)
    importance = pl.read_parquet(tmp_path / "a" / IMPORTANCE_TABLE)
    assert set(importance["kind"]) == {"head", "channel"}
    # zero steps of fine-tuning: the largest sub-network is the dense model, reordered
    x = torch.randint(100, (2, 16))
    zero = finetune(dense_file, space, training(1, lr=1e-12, warmup_steps=0, min_lr_ratio=1.0),
                    shards, IMPORTANCE, tmp_path / "c", tmp_path / "wc")
    with torch.no_grad():
        torch.testing.assert_close(load_supernet(zero)[0](x), load_dense(dense_file)(x),
                                   atol=1e-4, rtol=1e-4)


def test_search_and_table(space: SearchSpace, dense_file: Path, shakespeare: Path,
                          tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    path = finetune(dense_file, space, training(2), shards, IMPORTANCE, tmp_path / "s",
                    tmp_path / "ws")
    supernet, _ = load_supernet(path)
    val = shards.split("val")
    evaluator = SubnetEvaluator(supernet, validation_batches(val, 32, 1, 2, 0),
                                build_cloze(val, 6, 16, 8, 3, 0), TIMING, torch.device("cpu"))
    search = SubnetSearchSettings.parse({
        "objectives": {"ppl-params": ["perplexity", "params"],
                       "ppl-latency": ["perplexity", "latency_ms"]},
        "algorithms": ["nsga2", "iterative"], "budget": 6, "seed": 0,
        "options": {"nsga2": {"population_size": 4},
                    "iterative": {"initial": 3, "per_round": 2, "population_size": 6,
                                  "generations": 2}}})
    runs = run_searches(evaluator, search)
    assert runs.group_by("objectives", "algorithm").len()["len"].to_list() == [6] * 4
    subnets = subnet_table(evaluator, runs, search.objectives)
    assert subnets["arch_id"].is_unique().all()
    front = subnets.filter("pareto_ppl-params")
    assert front.height >= 1 and front["accuracy"].is_not_null().all()
    assert subnets.filter(pl.col("pareto_ppl-latency"))["latency_ms"].is_not_null().all()

    dense = load_dense(dense_file)
    chosen = picks(subnets, 1e9, search.objectives, [0.01], space.largest().id)
    assert chosen[0] == (FAIR_REFERENCE, space.largest().id)
    calibration = calibration_batches(shards, space.block_size, IMPORTANCE)
    pretrained = copy.deepcopy(dense)
    reorder(pretrained, unit_importance(pretrained, calibration))
    sampler = WindowSampler(shards.split("train"), space.block_size)
    plan = BaselinePlan(calibration, FINETUNES, pretrained,
                        lambda model, keep: recover(model, training(2), sampler,
                                                    torch.device("cpu"), keep))
    table = compression_table(dense, evaluator, chosen, ["int8_dynamic"], plan)
    models = table.filter(pl.col("baseline").is_in(["dense", "search"]))
    assert models.height == 2 * (1 + len(chosen))
    # baselines at the size of each searched pick, of each training, unquantized
    searched = {row["model"]: row["params"] for row in table.filter(
        (pl.col("baseline") == "search") & (pl.col("quant") == "none")).iter_rows(named=True)}
    found = table.filter(~pl.col("baseline").is_in(["dense", "search"]))
    assert set(found["quant"]) == {"none"} and set(found["matched_to"]) == set(searched)
    assert set(found["finetune"]) == set(FINETUNES)
    assert table.filter(pl.col("baseline") == "search")["finetune"].unique().to_list() == [
        "supernet"]
    # pruned from the same pretrained weights: training changes the perplexity
    untrained = found.filter(pl.col("finetune") == "none").sort("model")["perplexity"]
    trained = found.filter(pl.col("finetune") == "equal").sort("model")["perplexity"]
    assert (untrained != trained).all()
    for row in found.iter_rows(named=True):
        if row["baseline"] == "wanda":  # as many nonzeros, stored sparse
            assert row["params"] == searched[row["matched_to"]]
        else:
            assert row["params"] <= searched[row["matched_to"]]
        assert row["perplexity"] > 0 and row["latency_ms"] > 0
    assert set(found.filter(pl.col("matched_to") == next(iter(searched)))["baseline"]) >= {
        "uniform_width", "wanda"}
    edge = search_edge([table])
    assert edge.height == found.height and set(edge["baseline"]) == set(found["baseline"])
    for row in edge.iter_rows(named=True):
        assert row["perplexity_vs_search"] == pytest.approx(
            row["perplexity"] / row["pick_perplexity"] - 1)
    assert compression_figure(table, subnets, runs, tmp_path / "compress")[0].exists()
    pretrained = table.row(0, named=True)
    assert pretrained["model"] == "dense"
    assert pretrained["size_x_vs_pretrained"] == pretrained["throughput_x_vs_pretrained"] == 1
    # the fair reference: every ratio is taken against the fine-tuned largest sub-network
    fair = table.filter((pl.col("model") == FAIR_REFERENCE) & (pl.col("quant") == "none"))
    fair_row = fair.row(0, named=True)
    assert fair_row["size_x"] == 1 and fair_row["throughput_x"] == 1
    assert fair_row["perplexity_rel_change"] == 0 and fair_row["accuracy_change"] == 0
    assert fair_row["perplexity"] == pytest.approx(evaluator.perplexity(space.largest()))
    for row in table.filter(pl.col("perplexity").is_not_null()).iter_rows(named=True):
        assert row["perplexity_rel_change"] == pytest.approx(
            row["perplexity"] / fair_row["perplexity"] - 1)
        assert row["perplexity_rel_change_vs_pretrained"] == pytest.approx(
            row["perplexity"] / pretrained["perplexity"] - 1)
    with pytest.raises(ValueError, match="fair reference"):
        compression_table(dense, evaluator, chosen[1:], [])
    quantized = table.filter(pl.col("quant") == "int8_dynamic")
    assert (quantized["size_x"] > 1.3).all()  # int8 Linear weights (the embedding stays fp32)
    assert (quantized["perplexity_rel_change"].abs() < 0.2).all()


def test_huggingface_checkpoint_becomes_the_supernet(space: SearchSpace, shakespeare: Path,
                                                     tmp_path: Path) -> None:
    """A local LLaMA checkpoint of the space's largest arch (built with transformers, no
    download) is imported, reordered and fine-tuned; with a zero learning rate the largest
    sub-network still computes the checkpoint's logits."""
    transformers = pytest.importorskip("transformers")
    from hwgptbench.compress.dense import from_huggingface

    largest = space.largest()
    config = transformers.LlamaConfig(
        vocab_size=4096, hidden_size=largest.embed_dim, intermediate_size=largest.mlp_hidden[0],
        num_hidden_layers=largest.n_layer, num_attention_heads=largest.n_head[0],
        num_key_value_heads=space.n_kv_head, max_position_embeddings=space.block_size,
        rms_norm_eps=space.norm_eps, head_dim=space.head_size)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "ckpt")
    dense = from_huggingface(tmp_path / "ckpt", space, tmp_path / "dense.pt")
    path = finetune(dense, space, training(1, lr=1e-12, warmup_steps=0, min_lr_ratio=1.0),
                    TokenShards.open(shakespeare), IMPORTANCE, tmp_path / "ft", tmp_path / "w")
    x = torch.randint(4096, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(load_supernet(path)[0](x), hf(x).logits, atol=1e-4,
                                   rtol=1e-4)


def test_commands_name_the_compress_entries_they_miss(tmp_path: Path) -> None:
    from hwgptbench.cli import main

    partial = tmp_path / "compress.table.json"
    partial.write_text('{"compress": {"table": {"tolerances": [0.01]}}}')
    assert main(["compress-dense", "--params", str(partial), "--data", "x", "--out",
                 str(tmp_path / "d.pt"), "--work-dir", str(tmp_path)]) == 2
    assert not (tmp_path / "d.pt").exists()
