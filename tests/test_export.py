"""Export of fixed sub-networks (hwgptbench.export): pt2 and ONNX of per-layer archs, Hugging Face
folders of uniform llama and gpt_neox archs read back with from_pretrained, the manifest, and
the errors for formats that do not apply. Tiny random supernets, fp32 on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from hwgptbench.errors import UserError
from hwgptbench.export import hf, onnx_export
from hwgptbench.export.check import FormatUnavailableError
from hwgptbench.export.manifest import FORMAT
from hwgptbench.export.write import export_arch, load_exported, load_source
from hwgptbench.io import save_torch, sha256_file
from hwgptbench.model import SuperGPT
from hwgptbench.model.dense import save_dense
from hwgptbench.settings.compress import TimingSettings
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.tokens.tokenizer import EOT_TOKEN, train_bpe
from hwgptbench.training.train import supernet_state

VOCAB = 300
NEOX = {"embed_dim": [32, 64], "n_layer": [2, 3], "n_head": [2, 4], "mlp_ratio": [2, 4],
        "bias": [True, False], "head_size": 16, "block_size": 16, "rotary_fraction": 0.25}
LLAMA = NEOX | {"family": "llama", "bias": [False], "n_kv_head": 2, "rotary_fraction": 1.0,
                "rope_base": 500.0, "norm_eps": 1e-6}
PER_LAYER = Arch(64, 3, (4, 2, 4), (4, 2, 4), True)  # gpt_neox
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "all that glitters is not gold"] * 20


def supernet(section: dict[str, Any], seed: int = 0) -> SuperGPT:
    """A random supernet whose logits are far from zero (norm weights and biases randomised)."""
    torch.manual_seed(seed)
    model = SuperGPT(SearchSpace.from_dict("t", section), VOCAB).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and ("ln" in name):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)
    return model


@torch.no_grad()
def sub_logits(model: SuperGPT, arch: Arch, ids: torch.Tensor) -> torch.Tensor:
    """The supernet's own (eager, weight-sharing) logits of a sub-network."""
    model.set_arch(arch)
    return model(ids)


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(VOCAB, shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(iter(TEXT), len(TEXT), VOCAB, 1).save(str(path))
    return path


@pytest.fixture(scope="module")
def neox() -> SuperGPT:
    return supernet(NEOX)


@pytest.fixture(scope="module")
def per_layer(neox: SuperGPT, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Every applicable format of a per-layer gpt_neox arch extracted from a supernet file."""
    folder = tmp_path_factory.mktemp("export")
    save_torch(supernet_state(neox, neox.space, None, 0, "f"), folder / "supernet.pt")
    model, info = load_source(folder / "supernet.pt", PER_LAYER.id)
    out = folder / "out"
    return out, export_arch(model, out, None, {"scale": "tiny", **info}, None)


def test_pt2_of_a_per_layer_arch_equals_the_supernet(neox: SuperGPT, per_layer) -> None:
    out, manifest = per_layer
    check = manifest["formats"]["pt2"]["check"]
    assert check["passed"] and check["max_abs_diff"] <= 1e-5 and check["tolerance"] == 1e-5
    run = load_exported(out, "pt2")
    for shape in [(3, 5), (1, 16), (2, 1)]:
        expected = sub_logits(neox, PER_LAYER, ids(*shape))
        assert expected.std() > 0.1
        torch.testing.assert_close(run(ids(*shape)), expected, atol=1e-5, rtol=0)
    # the context bounds the length (a RuntimeError: the archive has no sample inputs, from
    # which torch would build its guard's AssertionError)
    with pytest.raises(RuntimeError, match="<= 16"):
        run(ids(1, 17))


def test_onnx_of_a_per_layer_arch_runs_on_onnx_runtime(neox: SuperGPT, per_layer) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    out, manifest = per_layer
    record = manifest["formats"]["onnx"]
    assert record["check"]["passed"] and record["check"]["tolerance"] == 1e-4
    assert record["files"] == {"model.onnx": (out / "model.onnx").stat().st_size}
    run = load_exported(out, "onnx")
    for shape in [(3, 5), (1, 16), (4, 1)]:
        torch.testing.assert_close(run(ids(*shape)), sub_logits(neox, PER_LAYER, ids(*shape)),
                                   atol=1e-4, rtol=0)
    model = neox.extract(PER_LAYER)
    timing = onnx_export.latency(model, out, ids(2, 16), TimingSettings(
        batch_size=2, seq_len=16, threads=1, warmup=1, min_repeats=3, max_repeats=3,
        target_rel_ci=0.02, max_seconds=1.0, estimator="median"), threads=1)
    assert timing["onnxruntime_ms"] > 0 and timing["torch_eager_ms"] > 0
    assert timing["onnxruntime_vs_eager"] == pytest.approx(
        timing["onnxruntime_ms"] / timing["torch_eager_ms"])


def test_the_manifest_records_source_checks_and_files(neox: SuperGPT, per_layer) -> None:
    out, manifest = per_layer
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["format"] == FORMAT and manifest["arch"] == PER_LAYER.id
    assert manifest["n_params"] == sum(p.numel() for p in neox.extract(PER_LAYER).parameters())
    source = manifest["source"]
    assert source["scale"] == "tiny" and source["kind"] == "supernet" and source["space"] == "t"
    assert source["checkpoint_sha256"] == sha256_file(out.parent / "supernet.pt")
    pt2 = manifest["formats"]["pt2"]
    assert pt2["files"] == {"model.pt2": (out / "model.pt2").stat().st_size} != {}
    assert pt2["size_bytes"] > 0 and pt2["export_seconds"] > 0 and manifest["trace_seconds"] > 0
    assert "layers 0,2 have 4 heads, layer 1 has 2 heads" in manifest["formats"]["hf"]["skipped"]
    assert not (out / "hf").exists()
    assert manifest["versions"]["torch_version"] == torch.__version__
    with pytest.raises(FormatUnavailableError, match="layers 0,2 have 4 heads"):
        load_exported(out, "hf")


def test_a_per_layer_arch_asked_for_in_hf_format_names_the_layers(tmp_path: Path,
                                                                  neox: SuperGPT) -> None:
    model = neox.extract(PER_LAYER)
    with pytest.raises(FormatUnavailableError) as err:
        export_arch(model, tmp_path / "out", ["pt2", "hf"])
    message = str(err.value)
    assert isinstance(err.value, UserError)
    assert "layers 0,2 have 4 heads, layer 1 has 2 heads" in message
    assert "layers 0,2 have MLP width 256, layer 1 has MLP width 128" in message
    assert "pt2 and ONNX" in message and not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="unknown export formats"):
        export_arch(model, tmp_path / "out", ["gguf"])


@pytest.mark.parametrize("section,arch,reason", [
    (NEOX, Arch(32, 2, (4, 4), (2, 2), True), "4 heads of size 16 != embed_dim 32"),
    (NEOX | {"n_kv_head": 2}, Arch(64, 2, (4, 4), (2, 2), True), "no grouped-query attention"),
    (LLAMA | {"rotary_fraction": 0.5}, Arch(64, 2, (4, 4), (2, 2), False), "whole head"),
], ids=["neox-head-size", "neox-gqa", "llama-partial-rotary"])
def test_uniform_archs_the_hf_classes_cannot_hold_are_refused(tmp_path: Path, section: dict,
                                                              arch: Arch, reason: str) -> None:
    model = SuperGPT(SearchSpace.from_dict("t", section), VOCAB).extract(arch)
    with pytest.raises(FormatUnavailableError, match=reason):
        export_arch(model, tmp_path / "out", ["hf"])
    assert reason in (hf.unsupported_reason(model.config) or "")  # what "all" records


def test_a_per_layer_llama_arch_exports_to_pt2(tmp_path: Path) -> None:
    model = supernet(LLAMA)
    arch = Arch(64, 2, (2, 4), (4, 2), False)  # grouped-query attention, 2 key/value heads
    manifest = export_arch(model.extract(arch), tmp_path, ["pt2"])
    assert list(manifest["formats"]) == ["pt2"] and manifest["formats"]["pt2"]["check"]["passed"]
    torch.testing.assert_close(load_exported(tmp_path, "pt2")(ids(2, 7)),
                               sub_logits(model, arch, ids(2, 7)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family,arch", [
    ("llama", Arch(32, 2, (4, 4), (4, 4), False)),  # 4 heads of 16 > embed_dim: head_dim is set
    ("gpt_neox", Arch(64, 2, (4, 4), (2, 2), True)),
    ("gpt_neox", Arch(32, 3, (2, 2, 2), (4, 4, 4), False)),  # MLP biases written as zeros
], ids=["llama", "gpt_neox-bias", "gpt_neox-nobias"])
def test_hf_folder_of_a_uniform_arch_equals_the_model(tmp_path: Path, tokenizer: Path,
                                                      family: str, arch: Arch) -> None:
    transformers = pytest.importorskip("transformers")
    model = supernet(LLAMA if family == "llama" else NEOX)
    manifest = export_arch(model.extract(arch), tmp_path, ["hf"], {"scale": "tiny"}, tokenizer)
    assert manifest["formats"]["hf"]["check"]["passed"] and manifest["trace_seconds"] is None
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                                 local_files_only=True)
    assert type(hf_model).__name__ == {"llama": "LlamaForCausalLM",
                                 "gpt_neox": "GPTNeoXForCausalLM"}[family]
    assert any((tmp_path / "hf").glob("*.safetensors"))
    for shape in [(2, 16), (1, 3)]:
        with torch.no_grad():
            got = hf_model(input_ids=ids(*shape)).logits
        expected = sub_logits(model, arch, ids(*shape))
        assert expected.std() > 0.1
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert tok.eos_token == EOT_TOKEN and hf_model.config.eos_token_id == tok.eos_token_id
    assert tok("the lazy fox")["input_ids"] == Tokenizer.from_file(str(tokenizer)).encode(
        "the lazy fox").ids


def test_hf_llama_export_imports_back_with_the_same_weights(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from hwgptbench.model.hf import load_hf_llama

    model = supernet(LLAMA).extract(Arch(64, 2, (4, 4), (2, 2), False))
    export_arch(model, tmp_path, ["hf"])
    back = load_hf_llama(tmp_path / "hf")
    assert back.config == model.config
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0)


def test_load_source_reads_a_dense_file_of_its_own_arch(tmp_path: Path, neox: SuperGPT) -> None:
    arch = Arch(32, 2, (2, 2), (2, 2), False)
    save_dense(neox.extract(arch), tmp_path / "dense.pt", {"source": "pretrain"})
    model, info = load_source(tmp_path / "dense.pt", arch.id)
    assert model.config.arch == arch and info["kind"] == "dense" and not model.training
    with pytest.raises(UserError, match="pass its own id"):
        load_source(tmp_path / "dense.pt", PER_LAYER.id)
    save_torch({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="neither a supernet file"):
        load_source(tmp_path / "other.pt", arch.id)
