"""The fixed GPT and the supernet: parameter counts, sub-network equivalence, no weight copies."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from hwgptbench.model import GPT, ElasticLinear, GPTConfig, SuperGPT
from hwgptbench.model.rotary import Rotary, apply_rotary
from hwgptbench.space import Arch, InvalidArchError, SearchSpace
from test_space import SPACES

VOCAB = 512


@pytest.fixture(scope="module")
def tiny() -> SearchSpace:
    return SearchSpace.from_dict("tiny", SPACES["tiny"])


@pytest.fixture(scope="module")
def supernet(tiny: SearchSpace) -> SuperGPT:
    torch.manual_seed(0)
    return SuperGPT(tiny, VOCAB).eval()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["s", "m", "l"])
def test_n_params_closed_form_paper_spaces(name: str) -> None:
    space = SearchSpace.from_dict(name, SPACES[name])
    with torch.device("meta"):
        supernet = SuperGPT(space, 50304)
    for arch in [space.largest(), space.smallest(), *space.sample(8, seed=0)]:
        assert space.n_params(arch, 50304) == n_params(supernet.extract(arch))
    assert n_params(supernet) == space.n_params(space.largest(), 50304)


def test_n_params_closed_form_tiny(tiny: SearchSpace, supernet: SuperGPT) -> None:
    for arch in [tiny.largest(), tiny.smallest(), *tiny.sample(20, seed=0)]:
        model = supernet.extract(arch)
        assert tiny.n_params(arch, VOCAB) == n_params(model)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert all((m.bias is not None) == arch.bias for m in linears)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert len(norms) == 2 * arch.n_layer + 1 and all(m.bias is not None for m in norms)


def test_subnetwork_equals_extracted_model(tiny: SearchSpace, supernet: SuperGPT,
                                           tokens: torch.Tensor) -> None:
    archs = [*tiny.sample(10, seed=5), tiny.largest(), tiny.smallest()]
    with torch.no_grad():
        for arch in archs:
            supernet.set_arch(arch)
            out = supernet(tokens)
            assert out.shape == (2, 48, VOCAB)
            torch.testing.assert_close(out, supernet.extract(arch)(tokens), atol=1e-5, rtol=0)


def test_set_arch_switches_cleanly(tiny: SearchSpace, supernet: SuperGPT,
                                   tokens: torch.Tensor) -> None:
    first, second = tiny.sample(2, seed=9)
    with torch.no_grad():
        supernet.set_arch(first)
        before = supernet(tokens)
        supernet.set_arch(tiny.largest())
        supernet.set_arch(second)
        supernet(tokens)
        supernet.set_arch(first)
        torch.testing.assert_close(supernet(tokens), before, atol=0, rtol=0)
        supernet.reset_arch()
        assert supernet.arch == tiny.largest()
        torch.testing.assert_close(supernet(tokens), supernet.extract(tiny.largest())(tokens),
                                   atol=1e-5, rtol=0)


def test_extract_copies_and_keeps_selection(tiny: SearchSpace, supernet: SuperGPT) -> None:
    supernet.set_arch(tiny.smallest())
    arch = tiny.largest()
    model = supernet.extract(arch)
    assert supernet.arch == tiny.smallest()
    assert model.config == GPTConfig.from_space(tiny, arch, VOCAB)
    supernet_ptrs = {p.untyped_storage().data_ptr() for p in supernet.parameters()}
    assert not supernet_ptrs & {p.untyped_storage().data_ptr() for p in model.parameters()}
    qkv = model.blocks[0].attn.qkv.weight
    attn = supernet.blocks[0].attn
    torch.testing.assert_close(qkv, torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
    supernet.reset_arch()


class RecordWeights(TorchFunctionMode):
    """Records the weight and bias operands of linear, embedding and layer_norm calls."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (F.linear, F.embedding, F.layer_norm):
            operands = (*args[1:], *kwargs.values())  # all but the input
            self.weights += [t for t in operands if isinstance(t, torch.Tensor)]
        return func(*args, **kwargs)


def test_subnetwork_forward_does_not_copy_weights(tiny: SearchSpace, supernet: SuperGPT,
                                                  tokens: torch.Tensor) -> None:
    arch = Arch(96, 3, (2, 4, 2), (3, 2, 4), True)
    supernet.set_arch(arch)
    storages = {p.untyped_storage().data_ptr() for p in supernet.parameters()}
    with torch.no_grad(), RecordWeights() as recorder:
        supernet(tokens)
    # per layer: 2 LN + q, k, v, proj + fc, proj, each weight and bias; plus wte, ln_f, LM head
    assert len(recorder.weights) == 3 * 16 + 1 + 2 + 1
    assert all(w.untyped_storage().data_ptr() in storages for w in recorder.weights)
    q = supernet.blocks[0].attn.q
    assert q.sub_weight().data_ptr() == q.weight.data_ptr()
    assert q.sub_weight().shape == (2 * tiny.head_size, 96)
    supernet.reset_arch()


def expected_slices(arch: Arch, hs: int) -> dict[str, tuple[slice, ...]]:
    """Index into every supernet parameter of the part that arch uses."""
    e = slice(None, arch.embed_dim)
    used = {"wte.weight": (slice(None), e), "ln_f.weight": (e,), "ln_f.bias": (e,)}
    for i, (h, hidden) in enumerate(zip(arch.n_head, arch.mlp_hidden, strict=True)):
        a, f = slice(None, h * hs), slice(None, hidden)
        shapes = {"ln1": (e,), "ln2": (e,), "attn.q": (a, e), "attn.k": (a, e), "attn.v": (a, e),
                  "attn.proj": (e, a), "mlp.fc": (f, e), "mlp.proj": (e, f)}
        for name, index in shapes.items():
            used[f"blocks.{i}.{name}.weight"] = index
            if arch.bias or name.startswith("ln"):  # the LayerNorms shift with bias off too
                used[f"blocks.{i}.{name}.bias"] = index[:1]
    return used


@pytest.mark.parametrize("bias", [True, False])
def test_gradients_stay_in_subnetwork(tiny: SearchSpace, tokens: torch.Tensor, bias: bool) -> None:
    torch.manual_seed(0)
    supernet = SuperGPT(tiny, VOCAB)
    arch = Arch(96, 3, (2, 4, 2), (3, 2, 4), bias)
    supernet.set_arch(arch)
    _, loss = supernet(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    used = expected_slices(arch, tiny.head_size)
    for name, param in supernet.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad.clone()
        if name in used:
            assert grad[used[name]].abs().sum() > 0, name
            grad[used[name]] = 0
        assert not grad.any(), name


def test_set_arch_rejects_invalid_arch(tiny: SearchSpace, supernet: SuperGPT) -> None:
    supernet.set_arch(tiny.smallest())
    with pytest.raises(InvalidArchError, match=r"n_head\[1\]: 3 not in choices"):
        supernet.set_arch(Arch(64, 2, (2, 3), (2, 2), True))
    with pytest.raises(InvalidArchError, match="embed_dim: 256"):
        supernet.extract(Arch(256, 2, (2, 2), (2, 2), True))
    assert supernet.arch == tiny.smallest()
    supernet.reset_arch()


def test_elastic_linear_checks_sizes() -> None:
    linear = ElasticLinear(8, 4)
    for args, match in [((0, 4, True), "in_features=0"), ((8, 5, True), "out_features=5"),
                        ((8, 4, 1), "bias=1")]:
        with pytest.raises(ValueError, match=match):
            linear.set_sub(*args)
    linear.set_sub(3, 2, False)
    assert linear(torch.ones(5, 3)).shape == (5, 2)
    linear.reset_sub()
    assert (linear.in_features, linear.out_features, linear.use_bias) == (8, 4, True)


def test_fixed_model_forward_and_loss(tiny: SearchSpace, tokens: torch.Tensor) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_space(tiny, tiny.smallest(), VOCAB))
    logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert logits.shape == (2, 47, VOCAB)
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected)
    assert abs(loss.item() - torch.log(torch.tensor(VOCAB)).item()) < 0.5
    with pytest.raises(ValueError, match="exceeds block_size 128"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_rotary_scores_depend_on_relative_position() -> None:
    rotary = Rotary(n_dims=8, block_size=32)
    cos, sin = rotary(32)
    q, k = torch.randn(2, 1, 1, 1, 16, generator=torch.Generator().manual_seed(0)).unbind(0)
    q, k = q.expand(1, 1, 32, 16), k.expand(1, 1, 32, 16)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    scores = q[0, 0] @ k[0, 0].T  # (T, T)
    torch.testing.assert_close(scores[5, 2], scores[20, 17])
    assert not torch.allclose(scores[5, 2], scores[5, 3])
    torch.testing.assert_close(q[0, 0, :, 8:], q[0, 0, :1, 8:].expand(32, 8))
