"""The s, m and l archs have the structure and exact parameter count of the networks that
HW-GPT-Bench trained (github.com/automl/HW-GPT-Bench at the commit of its perplexity data,
795cba8124826acc600df1bd2bb516b22f207671; paths below are in that tree).

The expected counts and shapes are derived here from the structure of that code, not from
:meth:`SearchSpace.n_params`; docs/model.md ("Parity with HW-GPT-Bench") lists each item.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from conftest import REPO_ROOT
from hwgptbench.model import GPT, GPTConfig, SuperGPT
from hwgptbench.model.gpt import TiedLMHead
from hwgptbench.space import Arch, SearchSpace

# config/juwels_owt_sw_{s,m,l}.yaml (model section): the choices of each supernet, head_size 64,
# block_size 1024, rotary_percentage 0.5, rope_base 10000, rope_condense_ratio 1, norm_eps 1e-5,
# n_query_groups = the largest n_head, _mlp_class GptNeoxMLP, gelu_approximate "none",
# parallel_residual true, lm_head_bias false, scale_embeddings false.
THEIR_CHOICES = {
    "s": {"embed_dim": [192, 384, 768], "n_layer": [10, 11, 12], "n_head": [4, 8, 12]},
    "m": {"embed_dim": [256, 512, 1024], "n_layer": [22, 23, 24], "n_head": [8, 12, 16]},
    "l": {"embed_dim": [320, 640, 1280], "n_layer": [34, 35, 36], "n_head": [8, 16, 20]},
}
THEIR_FIXED = {"mlp_ratio": [2, 3, 4], "bias": [False, True], "head_size": 64,
               "block_size": 1024, "rotary_fraction": 0.5}
HEAD_SIZE = 64
ROTARY_DIMS = int(HEAD_SIZE * 0.5)  # config.py: rope_n_elem = int(rotary_percentage * head_size)
# pl_gpt/data/lm_datamodule_nas.py: GPT-2's tokenizer (50257 tokens) plus a "<pad>" token, rounded
# up to a multiple of 128; lm_evaluator_configurable.py and train_llm_configurable.py set the
# model's vocab_size and padded_vocab_size to it (the configs' 50254 is overwritten).
TRAINED_VOCAB = math.ceil((50257 + 1) / 128) * 128


def trained_shapes(arch: Arch, vocab_size: int) -> list[tuple[int, ...]]:
    """Shapes of the parameters that HW-GPT-Bench's sub-network of arch computes with."""
    e, bias = arch.embed_dim, arch.bias
    # gpt/model.py: transformer.wte.weight = lm_head.weight (one tied (V, E) slice, no LM-head
    # bias since lm_head_bias is false); ln_f is a LayerNormSuper.
    shapes: list[tuple[int, ...]] = [(vocab_size, e), (e,), (e,)]
    for n_head, ratio in zip(arch.n_head, arch.mlp_ratio, strict=True):
        a = n_head * HEAD_SIZE  # head_size fixed at 64: attention width independent of E
        hidden = ratio * e  # lm_trainer_configurable.py: sample_mlp_ratio[i] * sample_embed_dim
        # gpt/super_modules/layernorm_super.py: a torch LayerNorm sliced to E, weight and bias
        # always (gpt/blocks/transformer_block.py: norm_1 and norm_2, no shared norm).
        shapes += [(e,), (e,), (e,), (e,)]
        # gpt/blocks/causal_self_attention.py: fused attn of (n_head + 2 * n_query_groups) *
        # head_size rows, n_query_groups = n_head (MHA), then proj; gpt/blocks/mlp.py
        # (GptNeoxMLP): fc and proj. gpt/super_modules/linear_super.py adds the sliced bias only
        # when the sampled bias flag is set.
        linears = [(3 * a, e), (e, a), (hidden, e), (e, hidden)]
        for out_features, in_features in linears:
            shapes.append((out_features, in_features))
            if bias:
                shapes.append((out_features,))
    return shapes


def trained_params(arch: Arch, vocab_size: int) -> int:
    """HW-GPT-Bench's trained sub-network's parameter count (the tied embedding once)."""
    return sum(math.prod(shape) for shape in trained_shapes(arch, vocab_size))


def paper_space(name: str) -> SearchSpace:
    spaces = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["spaces"]
    return SearchSpace.from_dict(name, spaces[name])


def parity_archs(space: SearchSpace) -> list[Arch]:
    """Largest and smallest (max and min layers) and seeded samples, each with bias on and off."""
    archs = [space.largest(), space.smallest(), *space.sample(4, seed=7)]
    return [dataclasses.replace(arch, bias=bias) for arch in archs for bias in (True, False)]


def parameter_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    return sorted(tuple(p.shape) for p in model.parameters())  # shared ones once


@pytest.mark.parametrize("name", ["s", "m", "l"])
def test_spaces_are_theirs(name: str) -> None:
    space = paper_space(name)
    for field, choices in (THEIR_CHOICES[name] | THEIR_FIXED).items():
        value = getattr(space, field)
        assert (list(value) if isinstance(value, tuple) else value) == choices, field
    assert (space.family, space.n_kv_head, space.rope_base, space.norm_eps) == (
        "gpt_neox", 0, 10000.0, 1e-5)


def test_paper_vocabulary_is_the_trained_one() -> None:
    assert TRAINED_VOCAB == 50304
    paper = yaml.safe_load((REPO_ROOT / "params" / "paper.yaml").read_text())
    assert paper["data"]["tokenizer"]["vocab_size"] == TRAINED_VOCAB


@pytest.mark.parametrize("name", ["s", "m", "l"])
def test_parameter_count_equals_trained_network(name: str) -> None:
    space = paper_space(name)
    for arch in parity_archs(space):
        expected = trained_params(arch, TRAINED_VOCAB)
        with torch.device("meta"):
            model = GPT(GPTConfig.from_space(space, arch, TRAINED_VOCAB))
        assert parameter_shapes(model) == sorted(trained_shapes(arch, TRAINED_VOCAB)), arch.id
        assert sum(p.numel() for p in model.parameters()) == expected, arch.id
        assert space.n_params(arch, TRAINED_VOCAB) == expected, arch.id


@pytest.mark.parametrize("name", ["s", "m", "l"])
def test_supernet_holds_their_supernet_parameters(name: str) -> None:
    """Their supernet stores every Linear bias (bias choices include true): the largest arch."""
    space = paper_space(name)
    with torch.device("meta"):
        supernet = SuperGPT(space, TRAINED_VOCAB)
    total = sum(p.numel() for p in supernet.parameters())
    assert total == trained_params(space.largest(), TRAINED_VOCAB)


@pytest.mark.parametrize("name", ["s", "m", "l"])
def test_modules_are_theirs(name: str) -> None:
    space = paper_space(name)
    with torch.device("meta"):
        model = GPT(GPTConfig.from_space(space, space.smallest(), TRAINED_VOCAB))
    assert model.config.rotary_dims == ROTARY_DIMS and isinstance(model.lm_head, TiedLMHead)
    assert [m for m in model.modules() if isinstance(m, torch.nn.Embedding)] == [model.wte]
    for block in model.blocks:
        assert block.parallel and block.mlp.act.approximate == "none"
        for norm in (block.ln1, block.ln2):
            assert isinstance(norm, torch.nn.LayerNorm) and norm.eps == 1e-5
            assert norm.bias is not None


def reference_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The forward of HW-GPT-Bench's sub-network (gpt/model.py, gpt/blocks/*.py,
    gpt/super_modules/*.py), written from its structure with model's weights.

    Their fused attention rows are grouped per head, (q_j, k_j, v_j) for head j; ours are
    [q; k; v], so the rows are permuted into their order first.
    """
    B, T = idx.shape
    e = model.config.arch.embed_dim
    # super_modules/rotary_embedding.py: theta over the first rope_n_elem dims, base 10000,
    # positions / condense_ratio (1), angles repeated twice; rotate-half on those dims only.
    theta = 1.0 / 10000 ** (torch.arange(0, ROTARY_DIMS, 2).float() / ROTARY_DIMS)
    angles = torch.outer(torch.arange(T).float(), theta).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()

    def rope(x: torch.Tensor) -> torch.Tensor:
        r, rest = x[..., :ROTARY_DIMS], x[..., ROTARY_DIMS:]
        half = ROTARY_DIMS // 2
        rotated = torch.cat((-r[..., half:], r[..., :half]), dim=-1)
        return torch.cat((r * cos + rotated * sin, rest), dim=-1)

    def norm(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, (e,), ln.weight, ln.bias, 1e-5)

    x = F.embedding(idx, model.wte.weight)  # no position embedding, no scaling
    for block in model.blocks:
        h = block.attn.n_head
        qkv = block.attn.qkv
        weight = qkv.weight.view(3, h, HEAD_SIZE, e).transpose(0, 1).reshape(3 * h * HEAD_SIZE, e)
        bias = (None if qkv.bias is None
                else qkv.bias.view(3, h, HEAD_SIZE).transpose(0, 1).reshape(-1))
        n1 = norm(x, block.ln1)
        heads = F.linear(n1, weight, bias).view(B, T, h, 3, HEAD_SIZE).permute(0, 2, 3, 1, 4)
        q, k, v = heads.unbind(2)  # (B, h, T, hs) each
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True,
                                           scale=1.0 / math.sqrt(HEAD_SIZE))
        attn = F.linear(y.transpose(1, 2).reshape(B, T, h * HEAD_SIZE), block.attn.proj.weight,
                        block.attn.proj.bias)
        mlp = block.mlp
        hidden = F.gelu(F.linear(norm(x, block.ln2), mlp.fc.weight, mlp.fc.bias))
        x = F.linear(hidden, mlp.proj.weight, mlp.proj.bias) + attn + x  # parallel residual
    return F.linear(norm(x, model.ln_f), model.wte.weight)  # tied LM head, no bias


@pytest.mark.parametrize("bias", [True, False])
def test_forward_equals_their_structure(bias: bool) -> None:
    space = paper_space("s")
    vocab = 256  # the structure does not depend on the vocabulary; keeps the test fast
    arch = dataclasses.replace(space.sample(1, seed=3)[0], bias=bias)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_space(space, arch, vocab)).eval()
    with torch.no_grad():  # non-zero shifts, so that a missing bias would show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)
    idx = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference_logits(model, idx), atol=1e-4, rtol=1e-4)
