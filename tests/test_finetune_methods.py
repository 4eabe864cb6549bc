"""Fine-tuning methods on a fixed model: full, LoRA (peft) and LoRA with frozen embeddings."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn as nn

from hwgptbench.compress.finetune_methods import (
    COLUMNS,
    METHODS,
    measure_finetune_methods,
    prepare_model,
    training_step,
)
from hwgptbench.meters.runner import build_model
from hwgptbench.model import GPT
from hwgptbench.params import ParamsError, section_of
from hwgptbench.settings.compress import CompressSettings, LoraSettings
from hwgptbench.space import SearchSpace

VOCAB = 211
CPU = torch.device("cpu")
LORA = LoraSettings(r=4, alpha=8.0, targets=("qkv", "proj", "fc", "gate", "up"))
SPACES = {family: SearchSpace.from_dict(family, {
    "embed_dim": [64], "n_layer": [2], "n_head": [4], "mlp_ratio": [4], "bias": [False],
    "head_size": 16, "block_size": 32, "rotary_fraction": 0.5, "family": family})
    for family in ("gpt_neox", "llama")}


def factory(family: str) -> GPT:
    space = SPACES[family]
    return build_model(space, space.largest(), VOCAB, 0, CPU, torch.float32)


def adapter_count(model: nn.Module, r: int, targets: tuple[str, ...]) -> tuple[int, int]:
    """LoRA parameters r * (in + out) and adapter tensors (A and B) of the targeted Linears,
    counted on the base model."""
    linears = [m for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    return sum(r * (m.in_features + m.out_features) for m in linears), 2 * len(linears)


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_methods_count_trainable_parameters_memory_and_optimizer_state(family: str) -> None:
    rows = measure_finetune_methods(partial(factory, family), METHODS, LORA, VOCAB,
                                    batch_size=2, seq_len=16, dtype="fp32", device=CPU,
                                    warmup=1, repeats=3, seed=0)
    by = {row["method"]: row for row in rows}
    assert [row["method"] for row in rows] == list(METHODS)
    assert all(list(row) == list(COLUMNS) and row["status"] == "ok" for row in rows)
    base = factory(family)
    n_base = sum(p.numel() for p in base.parameters())
    n_adapters, n_tensors = adapter_count(base, LORA.r, LORA.targets)
    n_vocab = VOCAB * 64 * (2 if family == "llama" else 1)  # untied LM head in llama

    full, lora, frozen = by["full"], by["lora"], by["lora_frozen_embeddings"]
    assert full["trainable_params"] == full["total_params"] == n_base
    assert full["rank"] is None and full["targets"] is None
    assert frozen["trainable_params"] == n_adapters
    assert lora["trainable_params"] == n_adapters + n_vocab
    assert frozen["total_params"] == lora["total_params"] == n_base + n_adapters
    assert frozen["trainable_params"] < lora["trainable_params"] < full["trainable_params"]
    assert (frozen["rank"], frozen["alpha"], frozen["targets"]) == (4, 8.0, "qkv,proj,fc,gate,up")
    # AdamW: two fp32 moments per trainable value and a fp32 step count per trainable tensor
    assert frozen["optim_bytes"] == 2 * 4 * n_adapters + 4 * n_tensors
    assert full["optim_bytes"] == 2 * 4 * n_base + 4 * len(list(base.parameters()))
    assert frozen["grad_bytes"] == 4 * n_adapters and full["grad_bytes"] == 4 * n_base
    assert frozen["memory_peak_mb"] < lora["memory_peak_mb"] < full["memory_peak_mb"]
    for row in rows:
        assert row["memory_reason"] is None and row["step_ms"] > 0
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["step_ms"] / 1000))


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_lora_starts_at_the_base_logits_and_trains_only_the_adapters(family: str) -> None:
    x = torch.randint(VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = factory(family)(x)
    model = prepare_model(factory(family), "lora_frozen_embeddings", LORA, seed=0)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=0, rtol=0)  # B starts at zero

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    step, _ = training_step(model.train(), x, "fp32")
    for _ in range(2):  # A's gradient is zero while B is: it moves from the second step
        step()
    after = dict(model.named_parameters())
    adapters = [name for name in before if "lora_" in name]
    assert len(adapters) == adapter_count(factory(family), LORA.r, LORA.targets)[1]
    for name, value in before.items():
        changed = not torch.equal(value, after[name])
        assert changed == (name in adapters), name


def test_lora_trains_the_embeddings_unless_frozen_and_rejects_bad_input() -> None:
    trainable = {}
    for method in ("lora", "lora_frozen_embeddings"):
        model = prepare_model(factory("llama"), method, LORA, seed=0)
        trainable[method] = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable["lora"] - trainable["lora_frozen_embeddings"] == {"wte.weight",
                                                                       "lm_head.weight"}
    with pytest.raises(ValueError, match="unknown fine-tuning method"):
        measure_finetune_methods(partial(factory, "llama"), ["qlora"], LORA, VOCAB, 1, 8)
    with pytest.raises(ValueError, match="dtype"):
        measure_finetune_methods(partial(factory, "llama"), ["full"], LORA, VOCAB, 1, 8,
                                 dtype="fp16")
    with pytest.raises(ParamsError, match=r"compress\.finetune_methods\.lora\.r: 0"):
        section_of(CompressSettings, {"finetune_methods": {"lora": {"r": 0}}})


def test_bf16_autocast_rows() -> None:
    rows = measure_finetune_methods(partial(factory, "llama"), ["full", "lora"], LORA, VOCAB,
                                    batch_size=1, seq_len=8, dtype="bf16", warmup=0, repeats=2)
    assert [row["dtype"] for row in rows] == ["bf16", "bf16"]
    assert all(row["status"] == "ok" and row["step_ms"] > 0 for row in rows)
