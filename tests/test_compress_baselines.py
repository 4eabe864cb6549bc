"""Compression baselines without search: uniform width, ShortGPT depth pruning and Wanda, on
tiny supernets with random weights (grouped-query llama, multi-head llama, GPT-NeoX with
biases and a tied embedding)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from hwgptbench.compress.baselines import (
    block_influence,
    depth_prune,
    head_choices,
    input_norms,
    keep_layers,
    nonzero_params,
    param_count,
    sparse_size_bytes,
    uniform_width,
    uniform_width_params,
    wanda,
    wanda_scores,
)
from hwgptbench.model import GPT, SuperGPT
from hwgptbench.space import Arch, SearchSpace

VOCAB = 64
BASE = {"embed_dim": [32], "n_layer": [2, 3], "n_head": [2, 4], "mlp_ratio": [1, 2],
        "bias": [False], "head_size": 8, "block_size": 16, "rotary_fraction": 1.0,
        "family": "llama", "n_kv_head": 2}
SPACES = {
    "llama-gqa": BASE,
    "llama-mha": BASE | {"n_kv_head": 0},
    "neox-bias": BASE | {"family": "gpt_neox", "n_kv_head": 0, "bias": [False, True],
                         "rotary_fraction": 0.5},
}


def supernet_of(name: str, seed: int = 0) -> SuperGPT:
    """A supernet of a test space with every parameter (norms and biases too) random."""
    torch.manual_seed(seed)
    supernet = SuperGPT(SearchSpace.from_dict(name, SPACES[name]), VOCAB)
    with torch.no_grad():
        for p in supernet.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return supernet.eval()


def calibration(seed: int = 1, n: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(VOCAB, (2, 16), generator=generator) for _ in range(n)]


def state_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], atol=0, rtol=0)


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def test_param_count_counts_a_tied_embedding_once() -> None:
    supernet = supernet_of("neox-bias")
    model = supernet.extract()
    assert param_count(model) == supernet.space.n_params(supernet.space.largest(), VOCAB)
    assert nonzero_params(model) == param_count(model)  # random: no zero entry
    assert sparse_size_bytes(model) == 4 * param_count(model)  # nothing sparse: dense fp32


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("heads, ratio", [(2, 1), (4, 1), (2, 2)])
def test_uniform_width_at_an_arch_of_the_space_is_that_subnetwork(name: str, heads: int,
                                                                  ratio: int) -> None:
    supernet = supernet_of(name)
    space = supernet.space
    largest = supernet.extract()
    bias = max(space.bias)
    arch = Arch(32, 3, (heads,) * 3, (ratio,) * 3, bias)
    before = state_copy(largest)
    pruned, built = uniform_width(largest, space.n_params(arch, VOCAB))
    assert_untouched(largest, before)
    assert built == arch and pruned.config.arch == arch
    assert param_count(pruned) == space.n_params(arch, VOCAB)
    x = calibration()[0]
    torch.testing.assert_close(logits(pruned, x), logits(supernet.extract(arch), x),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_uniform_width_is_the_widest_that_fits(name: str) -> None:
    model = supernet_of(name).extract()
    hidden_max = model.config.arch.mlp_hidden[0]
    for target in (param_count(model) * 3 // 5, param_count(model) * 4 // 5 + 7):
        pruned, arch = uniform_width(model, target)
        n_head, hidden = arch.n_head[0], arch.mlp_hidden[0]
        assert set(arch.n_head) == {n_head} and set(arch.mlp_hidden) == {hidden}
        params = param_count(pruned)
        assert params == uniform_width_params(model, n_head, hidden) <= target
        assert hidden == hidden_max or uniform_width_params(model, n_head, hidden + 1) > target
        fitting = [uniform_width_params(model, h, w) for h in head_choices(model)
                   for w in range(1, hidden_max + 1)]
        assert max(p for p in fitting if p <= target) == params
        # the reported arch builds the same model (its ratios give the exact widths)
        config = dataclasses.replace(model.config, arch=arch)
        assert param_count(GPT(config)) == params
    assert param_count(uniform_width(model, param_count(model))[0]) == param_count(model)
    with pytest.raises(ValueError, match="no uniform width fits"):
        uniform_width(model, 1000)


def test_uniform_width_keeps_every_key_value_group() -> None:
    model = supernet_of("llama-gqa").extract()
    assert head_choices(model) == [2, 4]
    assert head_choices(supernet_of("llama-mha").extract()) == [1, 2, 3, 4]
    pruned, arch = uniform_width(model, uniform_width_params(model, 2, 40))
    assert arch.n_head == (2,) * 3 and arch.mlp_hidden == (40,) * 3
    for block in pruned.block_list():
        assert block.attn.n_kv_head == 2 and block.attn.n_head == 2


def test_block_influence_range_and_identity_block() -> None:
    supernet = supernet_of("llama-gqa")
    model = supernet.extract()
    batches = calibration()
    influence = block_influence(model, batches)
    assert influence.shape == (3,) and ((influence >= 0) & (influence <= 2)).all()
    assert (influence > 1e-3).all()
    with torch.no_grad():
        block = model.block_list()[1]
        block.attn.proj.weight.zero_()
        block.mlp.proj.weight.zero_()
    influence = block_influence(model, batches)
    assert influence[1] < 1e-6 and (influence[[0, 2]] > 1e-3).all()


@pytest.mark.parametrize("name", sorted(SPACES))
def test_keep_layers_leading_is_the_shallower_subnetwork(name: str) -> None:
    supernet = supernet_of(name)
    model = supernet.extract()
    arch = dataclasses.replace(supernet.space.largest(), n_layer=2, n_head=(4, 4),
                               mlp_ratio=(2, 2))
    x = calibration()[0]
    torch.testing.assert_close(logits(keep_layers(model, [0, 1]), x),
                               logits(supernet.extract(arch), x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama-gqa", "neox-bias"])
def test_depth_prune_drops_the_identity_block_and_fits(name: str) -> None:
    supernet = supernet_of(name)
    with torch.no_grad():  # the last block passes its input through: lowest influence
        last = supernet.block_list()[-1]
        last.attn.proj.weight.zero_()
        last.mlp.proj.weight.zero_()
        if last.attn.proj.bias is not None:
            last.attn.proj.bias.zero_()
            last.mlp.proj.bias.zero_()
    model = supernet.extract()
    batches = calibration()
    two = dataclasses.replace(supernet.space.largest(), n_layer=2, n_head=(4, 4),
                              mlp_ratio=(2, 2))
    before = state_copy(model)
    pruned, kept = depth_prune(model, supernet.space.n_params(two, VOCAB),
                                block_influence(model, batches))
    assert_untouched(model, before)
    assert kept == [0, 1] and param_count(pruned) == supernet.space.n_params(two, VOCAB)
    x = batches[0]
    torch.testing.assert_close(logits(pruned, x), logits(supernet.extract(two), x),
                               atol=1e-5, rtol=1e-5)
    # a target between depths: the fewest blocks dropped, lowest influence first
    influence = block_influence(model, batches)
    target = param_count(model) - param_count(model.blocks[0]) // 2
    pruned, kept = depth_prune(model, target, block_influence(model, batches))
    dropped = set(range(3)) - set(kept)
    assert len(dropped) == 1 and param_count(pruned) <= target < param_count(model)
    assert influence[dropped.pop()] == influence.min()
    one = param_count(model.blocks[0])
    pruned, kept = depth_prune(model, param_count(model) - 2 * one + 1,
                                block_influence(model, batches))
    assert len(kept) == 1  # two blocks dropped; one block more would not fit
    with pytest.raises(ValueError, match="no depth fits"):
        depth_prune(model, 100, block_influence(model, batches))


def recorded_norms(model: GPT, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """||X_j|| of every block Linear's inputs, recorded independently of the module."""
    inputs: dict[str, list[torch.Tensor]] = {}
    handles = []
    for name, module in model.blocks.named_modules():
        if isinstance(module, nn.Linear):
            key = f"blocks.{name}.weight"
            inputs[key] = []
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, key=key: inputs[key].append(args[0].flatten(0, -2))))
    for x in batches:
        logits(model, x)
    for handle in handles:
        handle.remove()
    return {key: torch.cat(xs).norm(dim=0) for key, xs in inputs.items()}


@pytest.mark.parametrize("fraction", [0.5, 0.73])
def test_wanda_hits_the_target_and_ranks_by_its_score(fraction: float) -> None:
    model = supernet_of("llama-gqa").extract()
    batches = calibration()
    total = param_count(model)
    linear = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    target = total - int(fraction * linear) - 3  # not a whole number of rows
    before = state_copy(model)
    pruned, masks = wanda(model, input_norms(model, batches), target)
    assert_untouched(model, before)
    assert nonzero_params(pruned) == target and param_count(pruned) == total
    norms = recorded_norms(model, batches)
    assert set(masks) == set(norms)
    weights = dict(pruned.named_parameters())
    original = dict(model.named_parameters())
    pruned_count = 0
    entries = sum(m.numel() for m in masks.values())
    for name, mask in masks.items():
        w = weights[name]
        assert (w[~mask] == 0).all() and (w[mask] != 0).all()
        torch.testing.assert_close(w[mask], original[name][mask], atol=0, rtol=0)
        scores = wanda_scores(original[name], norms[name])
        for row, keep in zip(scores, mask, strict=True):
            assert row[keep].min() >= row[~keep].max()
        uniform = (total - target) * w.size(1) // entries
        assert ((~mask).sum(dim=1) >= uniform).all()
        pruned_count += int((~mask).sum())
    assert pruned_count == total - target  # the exact sparsity: no other parameter changed
    for name, value in pruned.state_dict().items():
        if name not in masks:
            torch.testing.assert_close(value, model.state_dict()[name], atol=0, rtol=0)
    csr = sum(int(m.sum()) * 8 + (m.size(0) + 1) * 4 for m in masks.values())
    dense = 4 * (total - entries)
    assert sparse_size_bytes(pruned) == csr + dense


def test_wanda_scores_by_activation_not_magnitude_alone() -> None:
    model = supernet_of("llama-gqa").extract()
    with torch.no_grad():  # the first input channel of every MLP down projection never fires
        for block in model.block_list():
            block.mlp.up.weight[0].zero_()
            block.mlp.proj.weight[:, 0] = 10.0  # huge weights, zero input
    linear = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    target = param_count(model) - 32 - linear // 10
    pruned, masks = wanda(model, input_norms(model, calibration()), target)
    for i in range(3):
        assert not masks[f"blocks.{i}.mlp.proj.weight"][:, 0].any()
    with pytest.raises(ValueError, match="target_nonzeros"):
        wanda(model, input_norms(model, calibration()), 10)
    unchanged, masks = wanda(model, input_norms(model, calibration()), nonzero_params(model))
    assert nonzero_params(unchanged) == nonzero_params(model)
