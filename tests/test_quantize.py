"""Quantization of project GPTs (hwgptbench.meters.quantize) on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hwgptbench.meters import quantize as quant
from hwgptbench.meters.quantize import (
    METHODS,
    QuantizationUnsupported,
    backend_of,
    linear_weight_bytes,
    model_size_bytes,
    quantize,
    unsupported_reason,
)
from hwgptbench.model import GPT, GPTConfig
from hwgptbench.space import SearchSpace

TINY = {"embed_dim": [64], "n_layer": [2], "n_head": [4], "mlp_ratio": [4], "bias": [True],
        "head_size": 16, "block_size": 64, "rotary_fraction": 0.5}
VOCAB = 256
DYNAMIC = torch.ao.nn.quantized.dynamic.Linear
# Relative L2 error of the logits against fp32 (seeded random init, 2 x 64 tokens): int8_dynamic
# measured 2.7-3.0% over seeds 0-5 (activations get 7 bits on the x86 engine), torchao int8
# weight-only 0.9%. The bounds leave 2x to 3x headroom; an unquantized or wrongly scaled model
# gives 0 or ~100%.
REL_ERROR = {"int8_dynamic": 0.06, "int8_weight_only": 0.03}
TORCHAO_METHODS = ("int8_weight_only", "int4_weight_only")


def tiny_gpt(**overrides: object) -> GPT:
    torch.manual_seed(0)
    space = SearchSpace.from_dict("t", {**TINY, **overrides})
    return GPT(GPTConfig.from_space(space, space.largest(), vocab_size=VOCAB)).eval()


@pytest.fixture(scope="module")
def model() -> GPT:
    return tiny_gpt()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))


def rel_error(a: nn.Module, b: nn.Module, x: torch.Tensor) -> float:
    with torch.inference_mode():
        ya, yb = a(x), b(x)
    return ((yb.float() - ya.float()).norm() / ya.float().norm()).item()


def linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (nn.Linear, DYNAMIC))]


def test_int8_dynamic_is_close_and_leaves_the_input_model_unchanged(model: GPT,
                                                                      tokens: torch.Tensor
                                                                      ) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = quantize(model, "int8_dynamic", tokens)
    assert 1e-4 < rel_error(model, quantized, tokens) < REL_ERROR["int8_dynamic"]
    assert all(type(m) is DYNAMIC for m in linears(quantized))
    assert len(linears(quantized)) == 8  # qkv, proj, fc, proj of 2 blocks; the LM head is tied
    assert all(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in linears(model))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert "torch.ao.quantize_dynamic" in backend_of("int8_dynamic")


def test_int8_dynamic_shrinks_the_linear_weights_about_4x(model: GPT) -> None:
    quantized = quantize(model, "int8_dynamic")
    fp32_linear, int8_linear = linear_weight_bytes(model), linear_weight_bytes(quantized)
    weights = sum(m.weight.numel() for m in linears(model))
    assert weights * 4 <= fp32_linear < weights * 4 * 1.01  # serialization adds < 1%
    # int8 is a quarter of fp32; per-channel scales (fp64) and zero points (int64), 16 bytes per
    # output row of 64 to 256 weights, take the ratio to ~3.2 on this tiny model
    assert 3.0 < fp32_linear / int8_linear <= 4.0
    saved = model_size_bytes(model) - model_size_bytes(quantized)
    assert saved == pytest.approx(fp32_linear - int8_linear, rel=0.05)  # embedding stays fp32


def test_llama_head_is_quantized_and_tied_head_is_not(tokens: torch.Tensor) -> None:
    llama = tiny_gpt(family="llama", bias=[False], rotary_fraction=1.0)
    quantized = quantize(llama, "int8_dynamic", tokens)
    assert type(quantized.lm_head) is DYNAMIC
    assert rel_error(llama, quantized, tokens) < REL_ERROR["int8_dynamic"]
    assert not isinstance(quantize(tiny_gpt(), "int8_dynamic").lm_head, DYNAMIC)


def test_unsupported_reasons_of_int8_dynamic(model: GPT) -> None:
    cuda = unsupported_reason("int8_dynamic", torch.device("cuda"), torch.float32)
    assert cuda is not None and "CPU" in cuda and "int8_weight_only" in cuda
    bf16 = unsupported_reason("int8_dynamic", "cpu", torch.bfloat16)
    assert bf16 is not None and "torch.float32" in bf16
    assert unsupported_reason("int8_dynamic", "cpu", torch.float32) is None
    half = tiny_gpt().to(torch.bfloat16)
    with pytest.raises(QuantizationUnsupported, match="float32"):
        quantize(half, "int8_dynamic")
    assert all(m.weight.dtype == torch.bfloat16 for m in linears(half))


def test_failure_on_the_example_input_raises_unsupported(model: GPT) -> None:
    with pytest.raises(QuantizationUnsupported, match="does not run"):
        quantize(model, "int8_dynamic", torch.zeros(1, 4))  # float ids: the embedding refuses


def test_none_is_an_equal_copy(model: GPT, tokens: torch.Tensor) -> None:
    copy = quantize(model, "none")
    assert copy is not model and rel_error(model, copy, tokens) == 0.0


@pytest.mark.parametrize("method", TORCHAO_METHODS)
def test_torchao_methods_run_or_say_how_to(method: str, model: GPT, tokens: torch.Tensor
                                           ) -> None:
    reason = unsupported_reason(method, "cpu", torch.float32)
    if reason is not None:
        fixes = {"int8_weight_only": ["pip install torchao"],
                 "int4_weight_only": ["CUDA", "bf16", "int8_dynamic"]}
        assert all(fix in reason for fix in fixes[method]), reason
        with pytest.raises(QuantizationUnsupported):
            quantize(model, method, tokens)
        return
    quantized = quantize(model, method, tokens)
    assert 1e-4 < rel_error(model, quantized, tokens) < REL_ERROR[method]
    assert linear_weight_bytes(model) / linear_weight_bytes(quantized) > 3.0
    assert backend_of(method).startswith("torchao 0.")
    assert all(type(m.weight) is nn.Parameter for m in linears(model))


def test_missing_torchao_names_the_install(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "_torchao", lambda: None)
    reason = unsupported_reason("int8_weight_only", "cpu", torch.float32)
    assert reason is not None and "pip install torchao" in reason
    with pytest.raises(QuantizationUnsupported, match="pip install torchao"):
        quantize(model, "int8_weight_only")
    assert "not installed" in backend_of("int8_weight_only")


def test_int4_needs_cuda_and_bf16() -> None:
    reason = unsupported_reason("int4_weight_only", "cuda", torch.float32)
    assert reason is not None and "bf16" in reason


def test_unknown_method_lists_the_methods(model: GPT) -> None:
    for call in (lambda: quantize(model, "int3"), lambda: unsupported_reason("int3", "cpu"),
                 lambda: backend_of("int3")):
        with pytest.raises(ValueError, match="int3") as err:
            call()
        assert all(method in str(err.value) for method in METHODS)
