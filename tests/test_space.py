"""Search spaces and archs: ids, sampling, validation, encoding."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from hwgptbench.space import Arch, InvalidArchError, SearchSpace

_PAPER = {"mlp_ratio": [2, 3, 4], "bias": [True, False], "head_size": 64, "block_size": 1024,
          "rotary_fraction": 0.5}
SPACES = {
    "tiny": {"embed_dim": [64, 96, 128], "n_layer": [2, 3, 4], "n_head": [2, 4],
             "mlp_ratio": [2, 3, 4], "bias": [True, False], "head_size": 16, "block_size": 128,
             "rotary_fraction": 0.5},
    "s": {"embed_dim": [192, 384, 768], "n_layer": [10, 11, 12], "n_head": [4, 8, 12], **_PAPER},
    "m": {"embed_dim": [256, 512, 1024], "n_layer": [22, 23, 24], "n_head": [8, 12, 16], **_PAPER},
    "l": {"embed_dim": [320, 640, 1280], "n_layer": [34, 35, 36], "n_head": [8, 16, 20],
          **_PAPER},
}
TOY = {"embed_dim": [8, 16], "n_layer": [1, 2, 3], "n_head": [1, 2], "mlp_ratio": [1, 2.5],
       "bias": [True, False], "head_size": 4, "block_size": 8, "rotary_fraction": 0.5}


def space(name: str) -> SearchSpace:
    return SearchSpace.from_dict(name, SPACES[name])


def enumerate_space(sp: SearchSpace) -> list[Arch]:
    """Every arch of a space, by brute force."""
    archs = []
    for e, n_layer, bias in itertools.product(sp.embed_dim, sp.n_layer, sp.bias):
        for heads in itertools.product(sp.n_head, repeat=n_layer):
            for ratios in itertools.product(sp.mlp_ratio, repeat=n_layer):
                archs.append(Arch(e, n_layer, heads, ratios, bias))
    return archs


@pytest.mark.parametrize("name", SPACES)
def test_id_round_trip(name: str) -> None:
    for arch in space(name).sample(200, seed=7):
        assert Arch.from_id(arch.id) == arch


def test_id_format() -> None:
    arch = Arch(128, 3, (4, 2, 4), (4, 3, 2), True)
    assert arch.id == "e128-l3-h4_2_4-r4_3_2-b1"
    assert Arch(64, 1, (2,), (2.5,), False).id == "e64-l1-h2-r2.5-b0"


@pytest.mark.parametrize("ratios", [(2.5, 1 / 3), (0.1, 7.000001), (1e-05 * 3e4, 4.0)])
def test_id_round_trips_float_ratios_exactly(ratios: tuple[float, float]) -> None:
    arch = Arch(128, 2, (2, 2), ratios, False)
    back = Arch.from_id(arch.id)
    assert back == arch
    assert [type(r) for r in back.mlp_ratio] == [type(r) for r in arch.mlp_ratio]
    assert [r.hex() if isinstance(r, float) else r for r in back.mlp_ratio] == [
        r.hex() if isinstance(r, float) else r for r in arch.mlp_ratio]


def test_integral_ratio_is_canonical_int() -> None:
    arch = Arch(64, 2, [2, 4], [2.0, 3], True)
    assert arch.mlp_ratio == (2, 3) and all(type(r) is int for r in arch.mlp_ratio)
    assert arch.n_head == (2, 4)
    assert arch == Arch(64, 2, (2, 4), (2, 3), True)


@pytest.mark.parametrize(("bad", "match"), [
    ("", "expected 5"),
    ("e128-l3-h4_2_4-r4_3_2", "expected 5"),
    ("x128-l3-h4_2_4-r4_3_2-b1", "part 'x128' is not e<embed_dim>"),
    ("e12a-l3-h4_2_4-r4_3_2-b1", "part 'e12a'"),
    ("e128-l3-h4__4-r4_3_2-b1", "part 'h4__4' is not h<n_head>"),
    ("e128-l3-h4_2_4-r4_3_2-b2", "part 'b2' is not b<bias>"),
    ("e128-l3-h4_2_4-r4_3_1e-5-b1", "expected 5"),
    ("e128-l3-h4_2-r4_3_2-b1", "n_head: 2 values for 3 layers"),
    ("e0-l1-h4-r4-b1", "embed_dim: 0 is not a positive int"),
    ("e0128-l3-h4_2_4-r4_3_2-b1", "not canonical, expected 'e128-l3"),
    ("e128-l3-h4_2_4-r4_3_2.0-b1", "not canonical"),
])
def test_from_id_errors(bad: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Arch.from_id(bad)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_head": (2, 2)}, r"n_head: 2 values for 3 layers"),
    ({"mlp_ratio": (2, 2, 2, 2)}, r"mlp_ratio: 4 values for 3 layers"),
    ({"embed_dim": 0}, r"embed_dim: 0 is not a positive int"),
    ({"n_head": (2, 0, 2)}, r"n_head\[1\]: 0 is not a positive int"),
    ({"mlp_ratio": (2, -1, 2)}, r"mlp_ratio\[1\]: -1 is not a positive finite number"),
    ({"mlp_ratio": (2, 1e-3, 2)}, r"mlp_ratio\[1\]: 0.001 \* embed_dim < 1"),
    ({"bias": 1}, r"bias: 1 is not a bool"),
])
def test_arch_checks_itself(kwargs: dict, match: str) -> None:
    fields = {"embed_dim": 64, "n_layer": 3, "n_head": (2, 2, 2), "mlp_ratio": (2, 2, 2),
              "bias": True} | kwargs
    with pytest.raises(InvalidArchError, match=match):
        Arch(**fields)


def test_from_dict_sorts_and_checks() -> None:
    sp = SearchSpace.from_dict("toy", TOY | {"embed_dim": [16, 8], "bias": [True, False]})
    assert sp.embed_dim == (8, 16) and sp.bias == (False, True)
    assert (sp.max_embed_dim, sp.max_n_layer, sp.max_n_head, sp.max_mlp_ratio) == (16, 3, 2, 2.5)
    assert sp.rotary_dims == 2
    bad = [
        ({k: v for k, v in TOY.items() if k != "bias"}, "missing keys \\['bias'\\]"),
        (TOY | {"extra": 1}, "unknown keys \\['extra'\\]"),
        (TOY | {"n_head": []}, "n_head: expected a non-empty list"),
        (TOY | {"n_head": [2, 2]}, "n_head: duplicate choices"),
        (TOY | {"n_layer": [0, 1]}, "n_layer: 0 is not a positive int"),
        (TOY | {"bias": ["yes"]}, "bias: 'yes' is not a bool"),
        (TOY | {"rotary_fraction": 0.25}, "1 rotary dims, must be even"),
        (TOY | {"rotary_fraction": 2}, "rotary_fraction: 2 is not in"),
        (TOY | {"head_size": 0}, "head_size: 0 is not a positive int"),
    ]
    for d, match in bad:
        with pytest.raises(ValueError, match=match):
            SearchSpace.from_dict("toy", d)


def test_size_matches_enumeration() -> None:
    toy = SearchSpace.from_dict("toy", TOY)
    archs = enumerate_space(toy)
    assert len(set(archs)) == len(archs) == toy.size() == 2 * 2 * (4 + 4**2 + 4**3)
    assert space("tiny").size() == 3 * 2 * (6**2 + 6**3 + 6**4)
    assert space("l").size() == 3 * 2 * (9**34 + 9**35 + 9**36)


def test_sample_whole_space_is_a_permutation() -> None:
    toy = SearchSpace.from_dict("toy", TOY)
    archs = toy.sample(toy.size(), seed=0)
    assert len(archs) == len(set(archs)) == toy.size()
    assert set(archs) == set(enumerate_space(toy))
    with pytest.raises(ValueError, match="cannot sample 337 distinct archs"):
        toy.sample(toy.size() + 1, seed=0)
    assert toy.sample(0, seed=0) == []
    assert list(toy.draw(seed=0)) == archs  # a draw ends with the space


@pytest.mark.parametrize("name", SPACES)
def test_sample_is_deterministic_and_distinct(name: str) -> None:
    sp = space(name)
    archs = sp.sample(300, seed=3)
    assert len(set(archs)) == 300
    assert archs == sp.sample(300, seed=3)
    assert archs[:50] == sp.sample(50, seed=3)
    assert archs != sp.sample(300, seed=4)
    assert list(itertools.islice(sp.draw(3), 300)) == archs  # sample takes the draw's first n
    for arch in archs:
        sp.validate(arch)
        # built from the space's choices unchecked: the same fields, types and id as checked
        checked = Arch(arch.embed_dim, arch.n_layer, arch.n_head, arch.mlp_ratio, arch.bias)
        assert vars(checked) | {"id": checked.id} == vars(arch) | {"id": arch.id}
        assert [type(v) for v in vars(checked).values()] == [type(v) for v in vars(arch).values()]
        assert [type(r) for r in checked.mlp_ratio] == [type(r) for r in arch.mlp_ratio]
        assert Arch.from_id(arch.id) == arch and hash(Arch.from_id(arch.id)) == hash(arch)


def test_sample_is_uniform() -> None:
    sp = space("tiny")
    n = 3000
    archs = sp.sample(n, seed=11)
    counts = {2: 6**2, 3: 6**3, 4: 6**4}
    total = sum(counts.values())
    layers = Counter(a.n_layer for a in archs)
    for n_layer, count in counts.items():
        p = count / total
        assert abs(layers[n_layer] - n * p) < 5 * math.sqrt(n * p * (1 - p))
    for values in (Counter(a.embed_dim for a in archs), Counter(h for a in archs for h in a.n_head),
                   Counter(a.bias for a in archs)):
        m = sum(values.values())
        p = 1 / len(values)
        for count in values.values():
            assert abs(count - m * p) < 5 * math.sqrt(m * p * (1 - p))


def test_largest_and_smallest() -> None:
    sp = space("s")
    assert sp.largest() == Arch(768, 12, (12,) * 12, (4,) * 12, True)
    assert sp.smallest() == Arch(192, 10, (4,) * 10, (2,) * 10, False)


@pytest.mark.parametrize(("arch", "match"), [
    (Arch(128, 3, (2, 4, 3), (2, 2, 2), True), r"n_head\[2\]: 3 not in choices \(2, 4\)"),
    (Arch(100, 2, (2, 2), (2, 2), True), r"embed_dim: 100 not in choices \(64, 96, 128\)"),
    (Arch(64, 5, (2,) * 5, (2,) * 5, True), r"n_layer: 5 not in choices \(2, 3, 4\)"),
    (Arch(64, 2, (2, 2), (2, 2.5), True), r"mlp_ratio\[1\]: 2.5 not in choices \(2, 3, 4\)"),
])
def test_validate_names_the_field(arch: Arch, match: str) -> None:
    with pytest.raises(InvalidArchError, match=match):
        space("tiny").validate(arch)


def test_validate_bias_choice() -> None:
    sp = SearchSpace.from_dict("no_bias", TOY | {"bias": [False]})
    with pytest.raises(InvalidArchError, match=r"bias: True not in choices \(False,\)"):
        sp.validate(Arch(8, 1, (1,), (1,), True))
    assert sp.largest().bias is False


def test_encode() -> None:
    sp = space("tiny")
    archs = [Arch(96, 2, (4, 2), (3, 2.0), False), sp.largest()]
    x = sp.encode(archs)
    assert x.dtype == np.float32 and x.shape == (2, 3 + 2 * 4)
    assert x[0].tolist() == [96, 2, 0, 4, 2, 0, 0, 3, 2, 0, 0]
    assert x[1].tolist() == [128, 4, 1] + [4] * 4 + [4] * 4
    names = sp.feature_names()
    assert len(names) == x.shape[1]
    assert names[:5] == ["embed_dim", "n_layer", "bias", "n_head_0", "n_head_1"]
    assert names[-1] == "mlp_ratio_3"
    assert sp.encode([]).shape == (0, 11)
    with pytest.raises(InvalidArchError, match="n_head"):
        sp.encode([Arch(96, 2, (3, 2), (3, 2), False)])


def test_n_params_closed_form_by_hand() -> None:
    sp = space("tiny")
    arch = Arch(64, 2, (2, 4), (2, 3), True)
    e, v, hs = 64, 100, 16
    layers = 0
    for h, r in zip(arch.n_head, arch.mlp_ratio, strict=True):
        a, f = h * hs, r * e
        layers += 2 * 2 * e + (e * 3 * a + 3 * a) + (a * e + e) + (e * f + f) + (f * e + e)
    assert sp.n_params(arch, v) == v * e + layers + 2 * e
