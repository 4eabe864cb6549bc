"""`hwgptbench compress-dense` on a Hugging Face checkpoint folder that is not one the import
reads: other weight files than model.safetensors (or the files its index names), a corrupt
safetensors file, an index naming files that are not there, a config.json that is not JSON, lacks
a dim or describes a larger model than its weights. Each is refused in one message naming the
file (exit 2, no traceback, nothing written); pickled weights only with
compress.allow_pickle_weights."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT
from hwgptbench import cli

transformers = pytest.importorskip("transformers")

CONFIG = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaMA checkpoint as save_pretrained writes it (config.json, model.safetensors)."""
    folder = tmp_path_factory.mktemp("hf") / "ckpt"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(folder)
    return folder


def compress_dense(folder: Path, tmp_path: Path, allow_pickle: bool = False) -> int:
    overlay = tmp_path / "overlay.json"
    overlay.write_text(json.dumps({"compress": {
        "source": "huggingface", "checkpoint": str(folder), "allow_pickle_weights": allow_pickle}}))
    return cli.main(["compress-dense", "--params", str(REPO_ROOT / "params.yaml"), "--params",
                     str(overlay), "--data", str(tmp_path / "data"), "--out",
                     str(tmp_path / "dense.pt"), "--work-dir", str(tmp_path / "work")])


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines()
             if line.startswith("hwgptbench compress-dense: error:")]
    assert len(lines) == 1, err
    return lines[0]


def state_dict_as_bin(folder: Path) -> None:
    """The checkpoint's weights as a pickled pytorch_model.bin, model.safetensors gone."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def with_config(**changes: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        doc = json.loads((folder / "config.json").read_text())
        doc.update(changes)
        (folder / "config.json").write_text(json.dumps({k: v for k, v in doc.items()
                                                         if v is not None}))
    return change


def sharded(names: list[str]) -> Callable[[Path], None]:
    """model.safetensors replaced by an index mapping every weight to the files named."""
    def change(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        weight_map = {f"model.layers.{i}.input_layernorm.weight": name
                      for i, name in enumerate(names)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": weight_map}))
    return change


def truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])


def index_not_json(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text("{\"weight_map\": ")


def bin_and_other_safetensors(folder: Path) -> None:
    shutil.copy(folder / "model.safetensors", folder / "adapter_model.safetensors")
    state_dict_as_bin(folder)


BAD = {
    "only a .bin": (state_dict_as_bin, "", "no .safetensors weights (found pytorch_model.bin)"
                    "; the weights are read from model.safetensors"),
    ".bin and another .safetensors": (
        bin_and_other_safetensors, "",
        "(found adapter_model.safetensors, pytorch_model.bin); the weights are read from "
        "model.safetensors or the files model.safetensors.index.json names"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "",
                   "no .safetensors weights (found no weight file)"),
    "truncated safetensors": (truncated, "/model.safetensors",
                              "not a safetensors file (Error while deserializing header"),
    "garbage safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64),
                            "/model.safetensors", "not a safetensors file"),
    "index naming missing files": (sharded(["model-00001-of-00002.safetensors"]),
                                   "/model.safetensors.index.json",
                                   "names 'model-00001-of-00002.safetensors', not a "
                                   ".safetensors file of the folder"),
    "index naming a path": (sharded(["../ckpt/model.safetensors"]),
                            "/model.safetensors.index.json", "names '../ckpt/model.safetensors'"),
    "index without weights": (sharded([]), "/model.safetensors.index.json", "no weight_map"),
    "index not json": (index_not_json, "/model.safetensors.index.json",
                       "cannot be read as JSON"),
    "config not json": (lambda f: (f / "config.json").write_text("{\"model_type\": "),
                        "/config.json", "cannot be read as JSON"),
    "config a list": (lambda f: (f / "config.json").write_text("[]"), "/config.json",
                      "not a JSON object"),
    "config without vocab_size": (with_config(vocab_size=None), "/config.json",
                                  "no vocab_size (a positive whole number)"),
    "config with a text dim": (with_config(hidden_size="32"), "/config.json",
                               "hidden_size is '32', not a positive whole number"),
    "config of another model_type": (with_config(model_type="gpt2"), "/config.json",
                                      "model_type 'gpt2'"),
    "config with a field of another type": (with_config(hidden_act=5), "/config.json",
                                            "transformers cannot read it"),
    "config larger than its weights": (with_config(num_hidden_layers=3), "/config.json",
                                       "describes a model of"),
    "no config": (lambda f: (f / "config.json").unlink(), "", "no config.json"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_compress_dense_refuses_a_folder_the_import_does_not_read(
        case: str, checkpoint: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    change, file, problem = BAD[case]
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    change(folder)
    assert compress_dense(folder, tmp_path) == 2
    line = refusal(capsys)
    assert line.startswith(f"hwgptbench compress-dense: error: {folder}{file}"), line
    assert problem in line, line
    assert not (tmp_path / "dense.pt").exists()


def test_compress_dense_refuses_a_path_that_is_not_a_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert compress_dense(tmp_path / "absent", tmp_path) == 2
    assert f"{tmp_path / 'absent'}: not a folder" in refusal(capsys)


def test_pickled_weights_load_once_allowed(checkpoint: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """compress.allow_pickle_weights reads the .bin of a folder without model.safetensors (an
    unrelated .safetensors beside it changes nothing)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    bin_and_other_safetensors(folder)
    assert compress_dense(folder, tmp_path, allow_pickle=True) == 0
    assert (tmp_path / "dense.pt").is_file()
    assert "error" not in capsys.readouterr().err
