"""The llama family: RMSNorm, SwiGLU, grouped-query attention, untied LM head, in the fixed
model and the supernet (sub-network equivalence, parameter counts, KV-cache decoding)."""

from __future__ import annotations

import pytest
import torch

from hwgptbench.model import GPT, GPTConfig, SuperGPT
from hwgptbench.space import Arch, SearchSpace

VOCAB = 300
LLAMA = {"embed_dim": [48, 64], "n_layer": [2, 3], "n_head": [2, 4, 6], "mlp_ratio": [1.5, 2.5],
         "bias": [False], "head_size": 8, "block_size": 32, "rotary_fraction": 1.0,
         "family": "llama", "n_kv_head": 2, "rope_base": 500.0, "norm_eps": 1e-6}


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return SearchSpace.from_dict("llama_test", LLAMA)


@pytest.fixture(scope="module")
def supernet(space: SearchSpace) -> SuperGPT:
    torch.manual_seed(0)
    model = SuperGPT(space, VOCAB).eval()
    with torch.no_grad():  # norm gains away from 1, so a wrong slice of them shows
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))


def test_space_section_round_trips_with_family_keys(space: SearchSpace) -> None:
    assert SearchSpace.from_dict(space.name, space.to_dict()) == space
    assert space.to_dict()["family"] == "llama" and space.to_dict()["n_kv_head"] == 2
    neox = {k: v for k, v in LLAMA.items() if k not in ("family", "n_kv_head", "rope_base",
                                                        "norm_eps")}
    assert "family" not in SearchSpace.from_dict("n", neox).to_dict()  # defaults stay implicit


@pytest.mark.parametrize("change, message", [
    ({"n_head": [2, 3]}, "multiple of n_kv_head"),
    ({"bias": [True, False]}, "no biases"),
    ({"family": "mamba"}, "family"),
    ({"norm_eps": 0}, "norm_eps"),
])
def test_space_rejects_inconsistent_family_dims(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SearchSpace.from_dict("bad", LLAMA | change)


def test_n_params_closed_form(space: SearchSpace) -> None:
    for arch in [space.largest(), space.smallest(), *space.sample(6, 3)]:
        model = GPT(GPTConfig.from_space(space, arch, VOCAB))
        assert sum(p.numel() for p in model.parameters()) == space.n_params(arch, VOCAB)


def test_fixed_model_has_the_family_modules(space: SearchSpace) -> None:
    model = GPT(GPTConfig.from_space(space, space.largest(), VOCAB))
    block = model.blocks[0]
    assert isinstance(block.ln1, torch.nn.RMSNorm) and block.ln1.eps == 1e-6
    assert {"gate", "up", "proj"} <= {n for n, _ in block.mlp.named_children()}
    assert block.attn.qkv.out_features == (6 + 2 * 2) * 8  # 6 query heads, 2 key/value heads
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()  # untied


def test_every_subnetwork_equals_its_extracted_model(space: SearchSpace, supernet: SuperGPT,
                                                     tokens: torch.Tensor) -> None:
    for arch in [space.largest(), space.smallest(), *space.sample(8, 0)]:
        supernet.set_arch(arch)
        with torch.no_grad():
            expected = supernet(tokens)
            got = supernet.extract(arch)(tokens)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    supernet.reset_arch()


def test_grouped_heads_keep_the_leading_heads_of_every_group(space: SearchSpace,
                                                             supernet: SuperGPT) -> None:
    arch = Arch(64, 2, (4, 2), (2.5, 1.5), False)
    model = supernet.extract(arch)
    q_max = supernet.blocks[0].attn.q.weight  # (2 groups * 3 heads * 8, 64)
    q = model.blocks[0].attn.qkv.weight[: 4 * 8]
    expected = torch.cat([q_max[0:16], q_max[24:40]])  # heads 0, 1 of group 0; 3, 4 of group 1
    torch.testing.assert_close(q, expected, atol=0, rtol=0)
    proj_max = supernet.blocks[0].attn.proj.weight
    torch.testing.assert_close(model.blocks[0].attn.proj.weight,
                               torch.cat([proj_max[:, 0:16], proj_max[:, 24:40]], dim=1))


def test_cached_decoding_equals_the_full_forward(space: SearchSpace, supernet: SuperGPT,
                                                 tokens: torch.Tensor) -> None:
    model = supernet.extract(Arch(48, 3, (2, 6, 4), (1.5, 2.5, 1.5), False)).eval()
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(tokens.size(0))
        steps = [model(tokens[:, :12], cache=cache)]
        steps += [model(tokens[:, t:t + 1], cache=cache) for t in range(12, tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].k.shape[1] == 2  # the cache holds the key/value heads only


def test_flops_match_the_flop_counter(space: SearchSpace, supernet: SuperGPT) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from hwgptbench.meters.flops import forward_flops

    x = torch.randint(VOCAB, (2, 16))
    for arch in [space.largest(), *space.sample(3, 1)]:
        with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH), \
                FlopCounterMode(display=False) as counter:
            supernet.extract(arch)(x)
        assert forward_flops(arch, space, VOCAB, 2, 16) == pytest.approx(
            counter.get_total_flops(), rel=0.01)


def test_breakdown_labels_every_llama_step(space: SearchSpace) -> None:
    from hwgptbench.runtime.breakdown import module_class

    model = GPT(GPTConfig.from_space(space, space.largest(), VOCAB))
    labels = {module_class(n, m) for n, m in model.named_modules()}
    assert labels - {None} == {"embedding", "qkv_proj", "attention_core", "out_proj", "mlp_up",
                               "mlp_activation", "mlp_down", "norm", "residual", "lm_head"}


def test_surrogate_features_count_params_and_flops_of_the_family(space: SearchSpace) -> None:
    from hwgptbench.meters.flops import forward_flops
    from hwgptbench.predictors.features import analytic_counts

    archs = [space.largest(), space.smallest(), *space.sample(10, 2)]
    n_params, flops = analytic_counts(space, space.encode(archs), VOCAB, 2, 16)
    assert n_params.tolist() == [space.n_params(a, VOCAB) for a in archs]
    assert flops.tolist() == [forward_flops(a, space, VOCAB, 2, 16) for a in archs]
