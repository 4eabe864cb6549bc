"""Import of Hugging Face LLaMA-family checkpoints: the imported GPT's logits equal the
transformers model's (full forward and KV-cache decoding), and configs whose math the GPT does
not reproduce are rejected naming the field. Tiny random models built with transformers itself
(no download); the reference uses transformers' eager attention (plain fp32 matmul + softmax)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hwgptbench.model.hf import _rope_theta, hf_config_summary, load_hf_llama, mlp_ratio_for  # noqa: E402
from hwgptbench.space import Arch  # noqa: E402

VOCAB = 300
B, T = 2, 24
TOL = 1e-4
BASE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 500.0, "max_position_embeddings": 64, "initializer_range": 0.1}


def save_model(path: Path, config_cls: type = transformers.LlamaConfig,
               model_cls: type = transformers.LlamaForCausalLM, seed: int = 0,
               **overrides) -> torch.nn.Module:
    """A random model (norm weights randomised too, so a mis-mapped norm shows) saved at path;
    returned in eval mode with eager attention."""
    config = config_cls(**(BASE | overrides))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


def tokens(seq_len: int = T) -> torch.Tensor:
    return torch.randint(VOCAB, (B, seq_len), generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def reference_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    return model(input_ids=idx, use_cache=False).logits


@pytest.mark.parametrize("overrides", [{}, {"num_key_value_heads": 4},
                                       {"tie_word_embeddings": True}],
                         ids=["gqa", "mha", "tied"])
def test_imported_logits_equal_transformers(tmp_path: Path, overrides: dict) -> None:
    hf = save_model(tmp_path, **overrides)
    model = load_hf_llama(tmp_path)
    cfg = model.config
    heads, kv = BASE["num_attention_heads"], overrides.get("num_key_value_heads", 2)
    assert cfg.family == "llama" and cfg.block_size == 64 and cfg.head_size == 16
    assert cfg.n_kv_head == (0 if kv == heads else kv)
    assert cfg.arch == Arch(64, 2, (4, 4), (2.5, 2.5), False)
    assert cfg.rope_base == 500.0 and cfg.norm_eps == 1e-6 and not model.training
    idx = tokens()
    expected = reference_logits(hf, idx)
    with torch.no_grad():
        got = model(idx)
    assert expected.std() > 0.1  # the comparison is not trivially small numbers
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    if overrides.get("tie_word_embeddings"):
        torch.testing.assert_close(model.lm_head.weight, model.wte.weight, atol=0, rtol=0)
        assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()


def test_kv_cache_decoding_equals_the_full_forward(tmp_path: Path) -> None:
    hf = save_model(tmp_path)
    model = load_hf_llama(tmp_path, block_size=32)
    assert model.config.block_size == 32
    idx = tokens()
    expected = reference_logits(hf, idx)
    prompt = 10
    with torch.no_grad():
        cache = model.new_cache(B)
        steps = [model(idx[:, :prompt], cache=cache)]
        steps += [model(idx[:, t:t + 1], cache=cache) for t in range(prompt, T)]
    assert cache.length == T
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=TOL, rtol=0)


def test_mistral_without_a_limiting_sliding_window(tmp_path: Path) -> None:
    hf = save_model(tmp_path / "full", transformers.MistralConfig, transformers.MistralForCausalLM,
                    sliding_window=None)
    idx = tokens()
    with torch.no_grad():
        got = load_hf_llama(tmp_path / "full")(idx)
    torch.testing.assert_close(got, reference_logits(hf, idx), atol=TOL, rtol=0)

    hf = save_model(tmp_path / "window", transformers.MistralConfig,
                    transformers.MistralForCausalLM, sliding_window=16)
    with pytest.raises(ValueError, match="sliding_window"):
        load_hf_llama(tmp_path / "window")  # block_size 64 would be masked by the window
    idx = tokens(16)
    with torch.no_grad():
        got = load_hf_llama(tmp_path / "window", block_size=16)(idx)
    torch.testing.assert_close(got, reference_logits(hf, idx), atol=TOL, rtol=0)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
     "rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                          "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
], ids=["rope-linear", "partial-rotary", "attention-bias", "mlp-bias", "gelu", "kv-heads"])
def test_configs_that_change_the_math_are_rejected(tmp_path: Path, overrides: dict,
                                                   field: str) -> None:
    params = BASE | overrides
    if "rope_parameters" in overrides:
        params.pop("rope_theta")
    transformers.LlamaConfig(**params).save_pretrained(tmp_path)
    for call in (load_hf_llama, hf_config_summary):
        with pytest.raises(ValueError, match=field):
            call(tmp_path)


def test_legacy_rope_fields(tmp_path: Path) -> None:
    """transformers < 5 keeps rope_theta and rope_scaling on the config; a config.json written
    that way is read too."""
    assert _rope_theta(SimpleNamespace(rope_theta=500.0, rope_scaling=None)) == 500.0
    assert _rope_theta(SimpleNamespace(rope_theta=500.0, rope_scaling={"rope_type": "default"})) \
        == 500.0
    for scaling in ({"type": "linear", "factor": 2.0}, {"rope_type": "llama3", "factor": 8.0}):
        with pytest.raises(ValueError, match="rope_scaling"):
            _rope_theta(SimpleNamespace(rope_theta=500.0, rope_scaling=scaling))
    legacy = BASE | {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    assert hf_config_summary(tmp_path)["rope_base"] == 500.0
    scaled = legacy | {"rope_scaling": {"type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        hf_config_summary(tmp_path)


def test_other_architectures_are_rejected(tmp_path: Path) -> None:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    for call in (load_hf_llama, hf_config_summary):
        with pytest.raises(ValueError, match="model_type 'gpt2'.*not a LLaMA-family"):
            call(tmp_path)


def test_config_summary(tmp_path: Path) -> None:
    transformers.LlamaConfig(**BASE).save_pretrained(tmp_path)
    assert hf_config_summary(tmp_path) == {
        "model_type": "llama", "embed_dim": 64, "n_layer": 2, "n_head": 4, "kv_heads": 2,
        "n_kv_head": 2, "head_size": 16, "mlp_hidden": 160, "mlp_ratio": 2.5,
        "vocab_size": VOCAB, "max_position_embeddings": 64, "rope_base": 500.0,
        "norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": None}


@pytest.mark.parametrize("hidden", [48, 64, 96, 576, 2048, 3072, 4096, 5120, 8192])
def test_mlp_ratio_gives_the_intermediate_size_back(hidden: int) -> None:
    for intermediate in (*range(hidden, 4 * hidden, 7), 11008, 13824, 14336, 1536, 8960):
        ratio = mlp_ratio_for(intermediate, hidden)
        arch = Arch(hidden, 1, (1,), (ratio,), False)
        assert arch.mlp_hidden == (intermediate,)
        assert Arch.from_id(arch.id) == arch


def test_missing_transformers_names_the_fix(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"hwgptbench\[hf\]"):
        load_hf_llama(tmp_path)
