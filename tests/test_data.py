"""The data stage: deterministic split, tokenizer and shards; clear errors; kill safety."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO_ROOT, tool_env
from hwgptbench.data.build import build
from hwgptbench.data.corpus import (
    CorpusUnavailableError,
    HuggingFaceCorpus,
    open_corpus,
    split_documents,
)
from hwgptbench.params import section_of
from hwgptbench.settings.sections import CorpusSettings, DataSettings
from hwgptbench.tokens.shards import TokenShards, token_dtype
from hwgptbench.tokens.tokenizer import TokenizerUnavailableError, load_tokenizer_file

DEFAULT = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["data"]


def _params(**overrides: object) -> dict:
    config = copy.deepcopy(DEFAULT)
    config["corpus"]["path"] = str(REPO_ROOT / DEFAULT["corpus"]["path"])
    config.update(overrides)
    return config


@pytest.fixture
def built(shakespeare: Path) -> Path:
    return shakespeare


def test_split_is_seeded_disjoint_and_complete() -> None:
    a = split_documents(42, 0.1, seed=1)
    assert a == split_documents(42, 0.1, seed=1)
    assert a != split_documents(42, 0.1, seed=2)
    assert sorted(a["train"] + a["val"]) == list(range(42))
    assert len(a["val"]) == 4
    assert split_documents(2, 0.01, seed=0)["val"] != []
    with pytest.raises(CorpusUnavailableError, match="at least 2"):
        split_documents(1, 0.1, seed=0)


def test_token_dtype() -> None:
    assert token_dtype(4096) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_build_outputs_decode_to_the_corpus(built: Path) -> None:
    shards = TokenShards.open(built, verify=True)
    manifest = shards.manifest
    assert manifest["tokenizer"]["vocab_size"] == DEFAULT["tokenizer"]["vocab_size"]
    assert manifest["dtype"] == "uint16"
    assert len(manifest["corpus"]["files"]) == 42
    for split in ("train", "val"):
        tokens = np.concatenate(shards.split(split))
        assert len(tokens) == manifest["splits"][split]["tokens"]
        eot = manifest["tokenizer"]["eot_id"]
        assert int((tokens == eot).sum()) == manifest["splits"][split]["documents"]
    # the first validation document comes back exactly from its tokens
    val_index = split_documents(42, DEFAULT["val_fraction"], DEFAULT["seed"])["val"][0]
    corpus = open_corpus(section_of(DataSettings, _params()).corpus)
    text = next(corpus.texts([val_index]))
    tokens = np.concatenate(shards.split("val"))
    first_doc = tokens[: int(np.argmax(tokens == manifest["tokenizer"]["eot_id"]))]
    assert shards.tokenizer().decode(first_doc.tolist()) == text


def test_same_params_give_byte_identical_outputs(built: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    build(section_of(DataSettings, _params()), again)
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name


def test_small_shards_and_tokenizer_file(built: Path, tmp_path: Path) -> None:
    config = _params(shard_tokens=200_000)
    config["tokenizer"] = {"kind": "file", "file": str(built / "tokenizer.json")}
    manifest = build(section_of(DataSettings, config), tmp_path / "out")
    train = manifest["splits"]["train"]
    assert len(train["shards"]) == -(-train["tokens"] // 200_000)
    assert all(s["tokens"] == 200_000 for s in train["shards"][:-1])
    original = TokenShards.open(built)
    resharded = TokenShards.open(tmp_path / "out", verify=True)
    for split in ("train", "val"):
        assert np.array_equal(np.concatenate(original.split(split)),
                              np.concatenate(resharded.split(split)))


def test_verify_detects_a_corrupted_shard(built: Path, tmp_path: Path) -> None:
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for path in built.iterdir():
        (copy_dir / path.name).write_bytes(path.read_bytes())
    shard = copy_dir / "val_000.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="val_000.bin"):
        TokenShards.open(copy_dir, verify=True)


def test_missing_corpus_folder_is_a_clear_error(tmp_path: Path) -> None:
    config = _params()
    config["corpus"]["path"] = str(tmp_path / "nowhere")
    with pytest.raises(CorpusUnavailableError, match="data.corpus.path"):
        build(section_of(DataSettings, config), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tokenizer_file_without_eot_is_rejected(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tok.json"
    Tokenizer(models.BPE()).save(str(path))
    with pytest.raises(TokenizerUnavailableError, match="data.tokenizer.file"):
        load_tokenizer_file(path)


def test_offline_huggingface_corpus_names_corpus_and_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # the libraries read these variables once, on import: a test that imported them earlier
    # (lm-eval, transformers) would otherwise leave them online, retrying for ~25 s
    import datasets.config
    import huggingface_hub.constants

    for module, name in ((datasets.config, "HF_HUB_OFFLINE"),
                         (datasets.config, "HF_DATASETS_OFFLINE"),
                         (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, name, True)
    spec = {"source": "huggingface", "dataset": "roneneldan/TinyStories", "split": "train",
            "text_field": "text"}
    with pytest.raises(CorpusUnavailableError) as info:
        open_corpus(CorpusSettings(**spec))
    message = str(info.value)
    assert "roneneldan/TinyStories" in message
    assert "source: text_files" in message and "data/corpora/shakespeare" in message


def test_huggingface_corpus_reads_a_local_dataset(tmp_path: Path) -> None:
    """The Hugging Face path end to end, on a dataset built locally with `datasets`."""
    import datasets

    texts = [f"document {i}: " + "the quick brown fox " * (i + 1) for i in range(20)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    local = CorpusSettings(source="huggingface", dataset="local", split="train",
                           text_field="text")
    corpus = HuggingFaceCorpus(datasets.load_from_disk(str(tmp_path / "ds")), "text", local)
    assert len(corpus) == 20
    assert list(corpus.texts([3, 7])) == [texts[3], texts[7]]
    with pytest.raises(CorpusUnavailableError, match="text_field"):
        HuggingFaceCorpus(datasets.load_from_disk(str(tmp_path / "ds")), "body", local)


def test_killed_stage_leaves_nothing_a_rerun_would_accept(tmp_path: Path) -> None:
    config = {"data": _params(shard_tokens=1024)}  # many small shards: a long write phase
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(config))
    out = tmp_path / "results" / "shakespeare"
    cmd = [sys.executable, "-m", "hwgptbench.cli", "data", "--params", str(params_file),
           "--out", str(out)]
    proc = subprocess.Popen(cmd, env=tool_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    staging: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        staging = [p for p in out.parent.glob(".shakespeare.tmp-*")
                   if any(p.glob("shakespeare/*.bin"))]  # the folder, inside its staging
        if staging:
            break
        time.sleep(0.01)
    assert staging, "the stage finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    with pytest.raises(FileNotFoundError, match="not a finished data-stage output"):
        TokenShards.open(out)
    subprocess.run(cmd, env=tool_env(), check=True, capture_output=True)
    assert [p.name for p in out.parent.iterdir()] == ["shakespeare"]
    TokenShards.open(out, verify=True)
