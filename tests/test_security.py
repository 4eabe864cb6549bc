"""Files from outside are data, never code (docs/security.md): every loader of a file that a
`dvc pull`, an import or a user can supply refuses one whose unpickling would run code, and the
code never runs (its marker file never appears)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from conftest import Hostile, surrogate_settings
from hwgptbench import Benchmark
from hwgptbench.compress import finetune
from hwgptbench.evaluation.perplexity import evaluate_supernets
from hwgptbench.io import TorchFileError, sha256_file
from hwgptbench.model.dense import load_dense
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.predictors import store
from hwgptbench.predictors.store import SurrogateFileError
from hwgptbench.settings.compress import ImportanceSettings
from hwgptbench.settings.sections import TrainingSettings
from hwgptbench.space import SearchSpace
from hwgptbench.surrogate.stage import merge_quality
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [32, 64], "n_layer": [1, 2], "n_head": [2, 4], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 16, "block_size": 32, "rotary_fraction": 0.5})


def _hostile_file(path: Path, marker: Path, **fields: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**fields, "model": Hostile(marker)}, path)
    return path


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    yield tmp_path / "marker"
    assert not (tmp_path / "marker").exists(), "a loader ran code from a file"


def _refused(load: Callable[[], Any], path: Path) -> None:
    with pytest.raises(TorchFileError, match=f"{path} cannot be read .*refused unread"):
        load()


def test_supernet_loaders_refuse_code(tmp_path: Path, marker: Path) -> None:
    path = _hostile_file(tmp_path / train.SUPERNET, marker, format=train.FORMAT, steps=1)
    _refused(lambda: train.load_supernet(path), path)
    _refused(lambda: evaluate_supernets({1: path}, SPACE.sample(2, seed=0), [], {},
                                        torch.device("cpu")),
             path)


def test_resume_checkpoint_refuses_code(tmp_path: Path, marker: Path, shakespeare: Path
                                        ) -> None:
    config = TrainingSettings(steps=2, batch_size=2, random_subnets=1, lr=1e-3,
                              betas=(0.9, 0.98), weight_decay=0.0, warmup_steps=0,
                              min_lr_ratio=0.1, grad_clip=1.0, checkpoint_every=1,
                              device="cpu", seed=0, snapshots=(), processes=1)
    path = _hostile_file(tmp_path / "work" / train.CHECKPOINT, marker, step=1)
    _refused(lambda: train.train(config, SPACE, TokenShards.open(shakespeare),
                                 tmp_path / "out", tmp_path / "work"), path)


def test_compression_loaders_refuse_code(tmp_path: Path, marker: Path) -> None:
    dense = _hostile_file(tmp_path / "dense.pt", marker, format=1)
    _refused(lambda: load_dense(dense), dense)
    imported = _hostile_file(tmp_path / "work" / finetune.IMPORTED, marker, fingerprint="x")
    importance = ImportanceSettings(enabled=True, batches=1, batch_size=1, seed=0)
    _refused(lambda: finetune.write_imported(dense, SPACE, None, importance, tmp_path / "work"),
             imported)


def test_pickled_huggingface_weights_need_the_opt_in(tmp_path: Path, marker: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from hwgptbench.model.hf import PickledWeightsError, load_hf_llama

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2)
    checkpoint = tmp_path / "ckpt"
    config.save_pretrained(checkpoint)
    torch.save({"model.embed_tokens.weight": Hostile(marker)},
               checkpoint / "pytorch_model.bin")
    with pytest.raises(PickledWeightsError, match=r"no \.safetensors weights \(found "
                       r"pytorch_model\.bin\).*compress\.allow_pickle_weights: true"):
        load_hf_llama(checkpoint)
    trusted = tmp_path / "trusted"  # a genuine pickled checkpoint loads once allowed
    config.save_pretrained(trusted)
    torch.save(transformers.LlamaForCausalLM(config).state_dict(), trusted / "pytorch_model.bin")
    with pytest.raises(PickledWeightsError):
        load_hf_llama(trusted)
    assert load_hf_llama(trusted, allow_pickle=True).config.vocab_size == 64


def test_benchmark_refuses_a_surrogate_holding_code(tmp_path: Path, marker: Path) -> None:
    archs = SPACE.sample(24, seed=1)
    scale = tmp_path / "results" / "tiny"
    size = np.array([a.embed_dim * a.n_layer for a in archs], dtype=float)
    table = pl.DataFrame({"arch_id": [a.id for a in archs], "train_steps": 10,
                          "perplexity": 100 / np.log(size)})
    section = {"families": ["mlp_ensemble"], "folds": 3, "min_rows": 10, "seed": 0,
               "coverage": 0.9, "mlp_ensemble": {"hidden": 8, "layers": 1, "members": 2,
                                                 "epochs": 5}}
    folder = scale / "surrogates"
    surrogates.fit_perplexity(surrogate_settings(section), SPACE, 64, table, folder / "perplexity")
    merge_quality([folder / "perplexity" / "quality.parquet"], "tiny",
                             folder / "quality.parquet", scale / "surrogate_quality.json")
    assert Benchmark.load("tiny", tmp_path / "results").query(archs[:2], "perplexity").height == 2
    weights = next((folder / "perplexity" / "mlp_ensemble").glob("*.pt"))
    torch.save([{"weight": Hostile(marker)}], weights)
    bench = Benchmark.load("tiny", tmp_path / "results")
    with pytest.raises(SurrogateFileError, match=f"{weights} does not match its SHA-256"):
        bench.query(archs[:2], "perplexity")
    reseal(weights.parent)  # a hostile folder whose manifest matches: the reader refuses it
    _refused(lambda: Benchmark.load("tiny", tmp_path / "results").query(archs[:2],
                                                                         "perplexity"), weights)


def reseal(folder: Path) -> None:
    """Rewrite a surrogate folder's manifest to match its files, as a hostile folder's would."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != store.MANIFEST)
    (folder / store.MANIFEST).write_text(json.dumps(
        {"format": store.FORMAT,
         "files": {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}}))
