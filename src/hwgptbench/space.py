"""Search spaces of GPT architectures and the architectures in them.

A search space is data (a section of params.yaml): the choices for the embedding width, the number
of layers, the per-layer head count and MLP ratio, and the bias flag, plus the fixed head size,
context length and rotary fraction, and the model family with its fixed dims (``family``:
``gpt_neox`` by default, or ``llama``; ``n_kv_head``, ``rope_base``, ``norm_eps``). An :class:`Arch`
picks one embedding width, one layer count, a head count and an MLP ratio for every layer, and the
bias flag. Archs have a canonical string id (``e128-l3-h4_2_4-r4_3_2-b1``) that round-trips exactly.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import UserError

if TYPE_CHECKING:
    import polars as pl

Ratio = int | float


class InvalidArchError(UserError, ValueError):
    """An arch is malformed or not in a search space; the message names the field."""


def _int(field: str, value: Any) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
        raise InvalidArchError(f"{field}: {value!r} is not a positive int")
    return int(value)


def _is_number(value: Any) -> bool:
    """Whether value is a real number (numpy's included) other than a bool. A plain check, not
    an isinstance narrowing: the ``numbers.Real`` stubs declare no comparison with an int."""
    return isinstance(value, Real) and not isinstance(value, bool)


def _ratio(field: str, value: Any) -> Ratio:
    """A positive finite ratio; an integral float becomes an int so ids and equality agree."""
    if not _is_number(value) or not 0 < value < math.inf:
        raise InvalidArchError(f"{field}: {value!r} is not a positive finite number")
    return int(value) if float(value).is_integer() else float(value)


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArchError(f"{field}: {value!r} is not a bool")
    return bool(value)


def _format_ratio(ratio: Ratio) -> str:
    """Shortest exact decimal, never in exponent notation."""
    return str(ratio) if isinstance(ratio, int) else np.format_float_positional(ratio, unique=True)


_INT = r"\d+"
_RATIO = r"\d+(?:\.\d+)?"
_ID_PARTS = (
    ("e", "embed_dim", _INT),
    ("l", "n_layer", _INT),
    ("h", "n_head", rf"{_INT}(?:_{_INT})*"),
    ("r", "mlp_ratio", rf"{_RATIO}(?:_{_RATIO})*"),
    ("b", "bias", "[01]"),
)
_MAX_ID = 10_000  # characters: far more than any arch of 1000 layers needs
_ID_FORMAT = "-".join(f"{prefix}<{field}>" for prefix, field, _ in _ID_PARTS)


@dataclass(frozen=True)
class Arch:
    """One GPT architecture: embedding width, depth, per-layer heads and MLP ratios, bias."""

    embed_dim: int
    n_layer: int
    n_head: tuple[int, ...]
    mlp_ratio: tuple[Ratio, ...]
    bias: bool

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "embed_dim", _int("embed_dim", self.embed_dim))
        set_(self, "n_layer", _int("n_layer", self.n_layer))
        for field in ("n_head", "mlp_ratio"):
            values = tuple(getattr(self, field))
            if len(values) != self.n_layer:
                raise InvalidArchError(f"{field}: {len(values)} values for {self.n_layer} layers")
            set_(self, field, values)
        set_(self, "n_head", tuple(_int(f"n_head[{i}]", h) for i, h in enumerate(self.n_head)))
        set_(self, "mlp_ratio",
             tuple(_ratio(f"mlp_ratio[{i}]", r) for i, r in enumerate(self.mlp_ratio)))
        set_(self, "bias", _bool("bias", self.bias))
        for i, hidden in enumerate(self.mlp_hidden):
            if hidden < 1:
                raise InvalidArchError(f"mlp_ratio[{i}]: {self.mlp_ratio[i]} * embed_dim < 1")

    @classmethod
    def _of_choices(cls, embed_dim: int, n_layer: int, n_head: tuple[int, ...],
                    mlp_ratio: tuple[Ratio, ...], bias: bool) -> Arch:
        """An arch of a search space's choices, which its ``__post_init__`` validated and
        normalised as this class's does (and checked the smallest MLP width): built without
        checking them again, which was most of the time of drawing archs."""
        arch = object.__new__(cls)
        for name, value in (("embed_dim", embed_dim), ("n_layer", n_layer), ("n_head", n_head),
                            ("mlp_ratio", mlp_ratio), ("bias", bias)):
            object.__setattr__(arch, name, value)
        return arch

    @property
    def mlp_hidden(self) -> tuple[int, ...]:
        """MLP hidden width of every layer, int(mlp_ratio * embed_dim)."""
        return tuple(int(r * self.embed_dim) for r in self.mlp_ratio)

    @cached_property
    def id(self) -> str:
        """Canonical string id, e.g. ``e128-l3-h4_2_4-r4_3_2.5-b1``."""
        heads = "_".join(map(str, self.n_head))
        ratios = "_".join(map(_format_ratio, self.mlp_ratio))
        return f"e{self.embed_dim}-l{self.n_layer}-h{heads}-r{ratios}-b{int(self.bias)}"

    @classmethod
    def from_id(cls, arch_id: str) -> Arch:
        """Parse a canonical id; raise :class:`InvalidArchError` (a ValueError) naming the bad
        part."""
        if not isinstance(arch_id, str):
            raise InvalidArchError(f"bad arch id {arch_id!r}: not a string")
        shown = arch_id if len(arch_id) <= 200 else arch_id[:200] + "..."
        if len(arch_id) > _MAX_ID:
            raise InvalidArchError(f"bad arch id {shown!r}: longer than {_MAX_ID} characters")
        parts = arch_id.split("-")
        if len(parts) != len(_ID_PARTS):
            raise InvalidArchError(f"bad arch id {shown!r}: expected {len(_ID_PARTS)} "
                                   f"'-'-separated parts {_ID_FORMAT}, got {len(parts)}")
        for part, (prefix, field, pattern) in zip(parts, _ID_PARTS, strict=True):
            if not (part.startswith(prefix) and re.fullmatch(pattern, part[1:], re.ASCII)):
                raise InvalidArchError(f"bad arch id {shown!r}: part {part[:40]!r} is not "
                                       f"{prefix}<{field}>")
        e, n_layer, heads, ratios, bias = (part[1:] for part in parts)
        try:
            arch = cls(embed_dim=int(e), n_layer=int(n_layer),
                       n_head=tuple(int(h) for h in heads.split("_")),
                       mlp_ratio=tuple(float(r) if "." in r else int(r) for r in ratios.split("_")),
                       bias=bias == "1")
        except InvalidArchError as err:
            raise InvalidArchError(f"bad arch id {shown!r}: {err}") from None
        except (ValueError, OverflowError) as err:  # numbers beyond any space
            raise InvalidArchError(f"bad arch id {shown!r}: {err}") from None
        if arch.id != arch_id:
            raise InvalidArchError(f"bad arch id {shown!r}: not canonical, expected {arch.id!r}")
        return arch


_CHOICES = ("embed_dim", "n_layer", "n_head", "mlp_ratio", "bias")
_SCALARS = ("head_size", "block_size", "rotary_fraction")
FAMILIES = ("gpt_neox", "llama")
# keys a space section may leave out, with their defaults (the GPT-NeoX family of the paper)
OPTIONAL = {"family": "gpt_neox", "n_kv_head": 0, "rope_base": 10000.0, "norm_eps": 1e-5}


def _choices(space: str, field: str, values: Any) -> tuple[Any, ...]:
    """Sorted, validated choices of one field."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"search space {space!r}: {field}: expected a non-empty list of choices, "
                         f"got {values!r}")
    check = {"bias": _bool, "mlp_ratio": _ratio}.get(field, _int)
    try:
        choices = tuple(sorted(check(field, v) for v in values))
    except InvalidArchError as err:
        raise ValueError(f"search space {space!r}: {err}") from None
    if len(set(choices)) != len(choices):
        raise ValueError(f"search space {space!r}: {field}: duplicate choices in {values!r}")
    return choices


def _randbelow(rng: np.random.Generator, bound: int) -> int:
    """A uniform int in [0, bound), exact for bounds beyond 64 bits."""
    if bound < 2**63:
        return int(rng.integers(bound))
    n_bits = bound.bit_length()
    while True:
        value = int.from_bytes(rng.bytes((n_bits + 7) // 8), "little") >> (-n_bits % 8)
        if value < bound:
            return value


@dataclass(frozen=True)
class SearchSpace:
    """Choices per architecture field, plus the fixed head size, context and rotary fraction."""

    name: str
    embed_dim: tuple[int, ...]
    n_layer: tuple[int, ...]
    n_head: tuple[int, ...]
    mlp_ratio: tuple[Ratio, ...]
    bias: tuple[bool, ...]
    head_size: int
    block_size: int
    rotary_fraction: float
    family: str = "gpt_neox"  # gpt_neox | llama (docs/model.md)
    n_kv_head: int = 0  # key/value heads of every layer (grouped-query attention); 0: one per head
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in _CHOICES:
            object.__setattr__(self, field, _choices(self.name, field, getattr(self, field)))
        for field in ("head_size", "block_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"search space {self.name!r}: {field}: {value!r} is not a "
                                 "positive int")
        fraction = self.rotary_fraction
        if not isinstance(fraction, Real) or isinstance(fraction, bool) or not 0 <= fraction <= 1:
            raise ValueError(f"search space {self.name!r}: rotary_fraction: {fraction!r} is not "
                             "in [0, 1]")
        if self.rotary_dims % 2:
            raise ValueError(f"search space {self.name!r}: rotary_fraction: head_size * "
                             f"rotary_fraction = {self.rotary_dims} rotary dims, must be even")
        if int(self.mlp_ratio[0] * self.embed_dim[0]) < 1:
            raise ValueError(f"search space {self.name!r}: mlp_ratio: smallest MLP hidden width "
                             "int(mlp_ratio * embed_dim) is 0")
        self._check_family()

    def _check_family(self) -> None:
        """The family and its fixed dims are consistent with the choices."""
        where = f"search space {self.name!r}"
        if self.family not in FAMILIES:
            raise ValueError(f"{where}: family: {self.family!r} is not one of {FAMILIES}")
        kv = self.n_kv_head
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 0:
            raise ValueError(f"{where}: n_kv_head: {kv!r} is not an int >= 0 (0: one key/value "
                             "head per query head)")
        if kv and any(h % kv for h in self.n_head):
            raise ValueError(f"{where}: n_head: every choice must be a multiple of n_kv_head "
                             f"{kv} (grouped-query attention), got {list(self.n_head)}")
        for field in ("rope_base", "norm_eps"):
            value = getattr(self, field)
            if not _is_number(value) or not value > 0:
                raise ValueError(f"{where}: {field}: {value!r} is not a positive number")
        if self.family == "llama" and self.bias != (False,):
            raise ValueError(f"{where}: bias: the llama family has no biases; set bias: [false]")

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> SearchSpace:
        """Build a space from its params.yaml section; every key is required."""
        keys = _CHOICES + _SCALARS
        missing = [k for k in keys if k not in d]
        unknown = sorted(set(d) - set(keys) - set(OPTIONAL))
        if missing or unknown:
            raise ValueError(f"search space {name!r}: missing keys {missing}, unknown keys "
                             f"{unknown}; expected {list(keys)} and optionally {list(OPTIONAL)}")
        return cls(name=name, **{k: d[k] for k in (*keys, *OPTIONAL) if k in d})

    def to_dict(self) -> dict[str, Any]:
        """The params.yaml section of this space (inverse of :meth:`from_dict`); optional keys
        only where they differ from their defaults."""
        section = {k: list(v) if isinstance(v, tuple) else v
                   for k, v in ((k, getattr(self, k)) for k in _CHOICES + _SCALARS)}
        return section | {k: getattr(self, k) for k, default in OPTIONAL.items()
                          if getattr(self, k) != default}

    @property
    def max_embed_dim(self) -> int:
        return max(self.embed_dim)

    @property
    def max_n_layer(self) -> int:
        return max(self.n_layer)

    @property
    def max_n_head(self) -> int:
        return max(self.n_head)

    @property
    def max_mlp_ratio(self) -> Ratio:
        return max(self.mlp_ratio)

    @property
    def rotary_dims(self) -> int:
        """Leading dims of each head's q and k that get rotary position embeddings."""
        return int(self.head_size * self.rotary_fraction)

    def kv_heads(self, n_head: int) -> int:
        """Key/value heads of a layer with n_head query heads."""
        return self.n_kv_head or n_head

    def _count(self, n_layer: int) -> int:
        """Number of archs with n_layer layers."""
        per_layer = len(self.n_head) * len(self.mlp_ratio)
        return len(self.embed_dim) * len(self.bias) * per_layer**n_layer

    def size(self) -> int:
        """Exact number of distinct archs."""
        return sum(self._count(n) for n in self.n_layer)

    def _decode(self, index: int) -> Arch:
        """The arch at position index in a fixed enumeration of the space."""
        for n_layer in self.n_layer:
            if index < self._count(n_layer):
                break
            index -= self._count(n_layer)
        index, e = divmod(index, len(self.embed_dim))
        index, b = divmod(index, len(self.bias))
        heads, ratios = [], []
        for _ in range(n_layer):
            index, h = divmod(index, len(self.n_head))
            index, r = divmod(index, len(self.mlp_ratio))
            heads.append(self.n_head[h])
            ratios.append(self.mlp_ratio[r])
        return Arch._of_choices(self.embed_dim[e], n_layer, tuple(heads), tuple(ratios),
                                self.bias[b])

    def all_archs(self) -> Iterator[Arch]:
        """Every arch of the space, in a fixed order (check :meth:`size` first)."""
        return map(self._decode, range(self.size()))

    def sample(self, n: int, seed: int) -> list[Arch]:
        """n distinct archs, uniform without replacement; a prefix of any longer draw."""
        size = self.size()
        if not 0 <= n <= size:
            raise ValueError(f"cannot sample {n} distinct archs from search space {self.name!r} "
                             f"of size {size}")
        return list(itertools.islice(self.draw(seed), n))

    def draw(self, seed: int) -> Iterator[Arch]:
        """Distinct archs, uniform without replacement, until the space is exhausted: the
        archs of ``sample(n, seed)`` are its first n (take as many as a use needs)."""
        size = self.size()
        rng = np.random.default_rng(seed)
        moved: dict[int, int] = {}  # sparse Fisher-Yates shuffle of range(size)
        for i in range(size):
            j = i + _randbelow(rng, size - i)
            yield self._decode(moved.get(j, j))
            moved[j] = moved.pop(i, i)

    def largest(self) -> Arch:
        """The arch with every field at its largest choice (bias on if allowed)."""
        n = self.max_n_layer
        return Arch(self.max_embed_dim, n, (self.max_n_head,) * n, (self.max_mlp_ratio,) * n,
                    max(self.bias))

    def smallest(self) -> Arch:
        """The arch with every field at its smallest choice (bias off if allowed)."""
        n = min(self.n_layer)
        return Arch(min(self.embed_dim), n, (min(self.n_head),) * n, (min(self.mlp_ratio),) * n,
                    min(self.bias))

    def first_invalid(self, arch_ids: Iterable[Any]) -> tuple[Any, InvalidArchError] | None:
        """The first of ``arch_ids`` (a table's column, from outside) that is no canonical id
        of an arch of this space, with why; None when each is one."""
        for arch_id in dict.fromkeys(arch_ids):
            try:
                self.validate(Arch.from_id(arch_id))
            except InvalidArchError as err:
                return arch_id, err
        return None

    def validate(self, arch: Arch) -> None:
        """Raise InvalidArchError naming the first field whose value is not a choice."""
        if not isinstance(arch, Arch):
            raise TypeError(f"expected an Arch, got {type(arch).__name__}")
        embed, depth, heads, ratios, bias = self._choice_sets
        if (arch.embed_dim in embed and arch.n_layer in depth and arch.bias in bias
                and heads.issuperset(arch.n_head) and ratios.issuperset(arch.mlp_ratio)):
            return  # set lookups first: 10^5 archs are validated per query
        values: list[tuple[str, Ratio, tuple[Ratio, ...]]] = [
            ("embed_dim", arch.embed_dim, self.embed_dim), ("n_layer", arch.n_layer, self.n_layer)]
        values += [(f"n_head[{i}]", h, self.n_head) for i, h in enumerate(arch.n_head)]
        values += [(f"mlp_ratio[{i}]", r, self.mlp_ratio) for i, r in enumerate(arch.mlp_ratio)]
        values.append(("bias", arch.bias, self.bias))
        for field, value, choices in values:
            if value not in choices:
                raise InvalidArchError(f"{field}: {value} not in choices {choices} of search "
                                       f"space {self.name!r}")

    def feature_names(self) -> list[str]:
        """Column names of :meth:`encode`."""
        layers = range(self.max_n_layer)
        return (["embed_dim", "n_layer", "bias"] + [f"n_head_{i}" for i in layers]
                + [f"mlp_ratio_{i}" for i in layers])

    @cached_property
    def _choice_sets(self) -> tuple[frozenset[Any], ...]:
        """The choices of embed_dim, n_layer, n_head, mlp_ratio and bias as sets."""
        return tuple(frozenset(getattr(self, f)) for f in
                     ("embed_dim", "n_layer", "n_head", "mlp_ratio", "bias"))

    def encode(self, archs: Sequence[Arch]) -> np.ndarray:
        """Fixed-length float32 features (n, 3 + 2 * max_n_layer); absent layers are 0."""
        n_max = self.max_n_layer
        rows = []
        for arch in archs:
            self.validate(arch)
            pad = (0,) * (n_max - arch.n_layer)
            rows.append((arch.embed_dim, arch.n_layer, arch.bias, *arch.n_head, *pad,
                         *arch.mlp_ratio, *pad))
        return np.array(rows, dtype=np.float32).reshape(len(rows), 3 + 2 * n_max)

    def n_params(self, arch: Arch, vocab_size: int) -> int:
        """Exact parameter count of the fixed model of arch (a tied embedding counted once)."""
        self.validate(arch)
        e, b = arch.embed_dim, int(arch.bias)
        llama = self.family == "llama"
        heads = 2 if llama else 1  # untied LM head
        norm = 1 if llama else 2  # RMSNorm: scale; LayerNorm: scale and shift, bias flag or not
        total = e * (heads * vocab_size + norm)  # token embedding, LM head, final norm
        for n_head, hidden in zip(arch.n_head, arch.mlp_hidden, strict=True):
            q, kv = n_head * self.head_size, self.kv_heads(n_head) * self.head_size
            mlp_in = 2 if llama else 1  # gate and up, or fc
            total += e * (2 * norm + 2 * q + 2 * kv + (mlp_in + 1) * hidden)  # norms, weights
            total += b * (q + 2 * kv + e + mlp_in * hidden + e)  # biases of the projections
        return total


def read_archs(path: str | os.PathLike[str]) -> list[Arch]:
    """The archs of a table file with an ``arch_id`` column (an archs table), in row order."""
    import polars as pl

    return read_archs_from(pl.read_parquet(Path(path), columns=["arch_id"]))


def read_archs_from(table: pl.DataFrame) -> list[Arch]:
    """The archs of a table with an ``arch_id`` column, in row order."""
    return [Arch.from_id(i) for i in table["arch_id"]]
