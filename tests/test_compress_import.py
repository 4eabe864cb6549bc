"""A dense model into the supernet: importance reordering keeps its function, the largest
sub-network equals it, and after reordering the leading units are the most important."""

from __future__ import annotations

import pytest
import torch

from hwgptbench.compress.importance import head_order, reorder, unit_importance
from hwgptbench.model import GPT, GPTConfig, SuperGPT
from hwgptbench.space import SearchSpace
from test_model_llama import LLAMA

VOCAB = 300
NEOX = {"embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 4], "mlp_ratio": [2, 3],
        "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5}


def dense_model(space: SearchSpace, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_space(space, space.largest(), VOCAB)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def batches(n: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(VOCAB, (2, 24), generator=generator) for _ in range(n)]


@pytest.mark.parametrize("section", [LLAMA, LLAMA | {"n_kv_head": 0}, NEOX],
                         ids=["llama-gqa", "llama-mha", "neox"])
def test_reordering_keeps_the_function_and_sorts_the_units(section: dict) -> None:
    space = SearchSpace.from_dict("t", section)
    model = dense_model(space)
    x = batches(1)[0]
    with torch.no_grad():
        before = model(x)
    scores = reorder(model, unit_importance(model, batches()))
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-5)
    rescored = unit_importance(model, batches())
    group = space.max_n_head // max(space.n_kv_head, 1)
    for layer, again in zip(scores, rescored, strict=True):
        torch.testing.assert_close(again.heads, layer.heads, atol=1e-4, rtol=1e-4)
        assert (layer.channels[:-1] >= layer.channels[1:]).all()
        for start in range(0, space.max_n_head, group):  # descending within every group
            block = layer.heads[start:start + group]
            assert (block[:-1] >= block[1:]).all()


def test_head_order_permutes_within_groups_only() -> None:
    scores = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.2, 0.8])
    assert head_order(scores, 2).tolist() == [1, 2, 0, 5, 3, 4]
    assert head_order(scores, 0).tolist() == [1, 5, 2, 3, 4, 0]


def test_scores_find_a_dead_unit() -> None:
    space = SearchSpace.from_dict("t", LLAMA)
    model = dense_model(space)
    with torch.no_grad():
        model.blocks[0].mlp.proj.weight[:, 5] = 0  # channel 5 writes nothing
        model.blocks[0].attn.proj.weight[:, 8:16] = 0  # head 1 writes nothing
    scores = unit_importance(model, batches())[0]
    assert scores.channels[5] == 0 and scores.channels.argmin() == 5
    assert scores.heads[1] == 0 and scores.heads.argmin() == 1
    reordered = reorder(model, unit_importance(model, batches()))[0]
    assert reordered.channels[-1] == 0  # the dead channel is sliced away first


@pytest.mark.parametrize("section", [LLAMA, NEOX], ids=["llama", "neox"])
def test_largest_subnetwork_equals_the_imported_model(section: dict) -> None:
    space = SearchSpace.from_dict("t", section)
    model = dense_model(space)
    supernet = SuperGPT(space, VOCAB).eval()
    supernet.load_dense(model)
    x = batches(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(supernet(x), model(x), atol=1e-6, rtol=1e-6)
        extracted = supernet.extract(space.largest())
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(extracted.state_dict()[key], tensor, atol=0, rtol=0)


def test_import_rejects_a_model_of_another_shape() -> None:
    space = SearchSpace.from_dict("t", LLAMA)
    other = SearchSpace.from_dict("o", LLAMA | {"embed_dim": [48], "n_kv_head": 0})
    supernet = SuperGPT(space, VOCAB)
    with pytest.raises(ValueError, match="arch: model") as error:
        supernet.load_dense(dense_model(other))
    assert "key/value heads" in str(error.value)
