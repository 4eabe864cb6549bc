"""LightGBM's core (``Booster``, ``Dataset``, ``train``), imported without its scikit-learn
and pandas integrations; and LightGBM model texts, parsed here before LightGBM reads them
(:func:`parse_model_text`, :func:`read_booster`).

``import lightgbm`` imports scikit-learn and pandas whenever they are installed (for its
estimator classes and DataFrame input): about 2 s of a 2.5 s import on 2 cores, most of a
cached ``hwgptbench query``. This project uses only the core on numpy arrays, so the first
import hides those two packages (unless they are loaded already) and then restores them; in
that process lightgbm's scikit-learn estimators (``LGBMRegressor``) are unavailable.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import UserError
from .io import read_outside_bytes

OPTIONAL = ("sklearn", "pandas")


def _import_core() -> ModuleType:
    if "lightgbm" in sys.modules:
        return sys.modules["lightgbm"]
    hidden = [name for name in OPTIONAL if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import lightgbm
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return lightgbm


if TYPE_CHECKING:
    import lightgbm as lgb
else:
    lgb = _import_core()


# -- model text read as data ------------------------------------------------------------------
# LightGBM's parser trusts its input: a split_feature beyond max_feature_idx segfaults, an array
# of the wrong length, a number it cannot read (``1_0``, full-width digits, an int beyond 32
# bits) or a multiclass objective aborts the process or corrupts its memory, and ``nan`` is read
# as a leaf value or threshold (docs/security.md). So a model text is parsed here first, by the
# grammar LightGBM writes for the models of this project (numerical trees of one regression
# output, every token ASCII and every number finite), and LightGBM is handed the text written
# anew from the parsed values: no byte it reads went unchecked.

MAX_FEATURES = 1_000_000
MAX_LEAVES = 131_072  # LightGBM's own bound on num_leaves
# Bounds by cost (docs/security.md, "Readers are bounded by cost"): the largest model text of
# the shipped tables' surrogates holds 200 trees of 15 leaves in 335 kB
MAX_TEXT = 32 << 20  # bytes of a model text, checked before it is read
MAX_TREES = 10_000  # trees, counted by the header's tree_sizes before a tree is parsed
MAX_TOTAL_LEAVES = 500_000  # leaves of all trees, counted before each tree's arrays are parsed
INT32 = (-(2**31), 2**31 - 1)
FLOAT32_MAX = 3.4028234663852886e38
OBJECTIVES = ("regression", "quantile")  # the point and the interval models' objectives
HEADER = ("version", "num_class", "num_tree_per_iteration", "label_index", "max_feature_idx",
          "objective", "feature_names", "feature_infos", "tree_sizes")
_FIXED = {"version": "v4", "num_class": "1", "num_tree_per_iteration": "1", "label_index": "0"}
END = "end of trees"

_INT = r"-?[0-9]{1,10}"
_REAL = r"-?[0-9]{1,24}(?:\.[0-9]{1,24})?(?:e[+-][0-9]{2,3})?"  # C's %g, ASCII digits only
_NAME = r"[A-Za-z0-9_]{1,256}"
_INFO = rf"none|\[{_REAL}:{_REAL}\]"  # a numerical feature's range (categorical: a:b:c)


def _tokens(token: str) -> re.Pattern[str]:
    """A line value of space-separated tokens (none included)."""
    return re.compile(rf"(?:{token})(?: (?:{token}))*|")


_INTS, _REALS, _NAMES, _INFOS = map(_tokens, (_INT, _REAL, _NAME, _INFO))


class ModelTextError(UserError, ValueError):
    """A LightGBM model text that is not a plain model of this project's, refused unread."""


def _ints(value: str, key: str, low: int = INT32[0], high: int = INT32[1]) -> list[int]:
    if not _INTS.fullmatch(value):
        raise ValueError(f"{key} holds {_quote(value)}, not ASCII decimal ints")
    numbers = list(map(int, value.split()))
    if numbers and not low <= min(numbers) <= max(numbers) <= high:
        raise ValueError(f"{key} holds a value outside {low}..{high}")
    return numbers


def _reals(value: str, key: str, limit: float = sys.float_info.max) -> list[float]:
    if not _REALS.fullmatch(value):
        raise ValueError(f"{key} holds {_quote(value)}, not finite ASCII decimal numbers")
    numbers = list(map(float, value.split()))  # the pattern leaves out nan and inf
    if numbers and not -limit <= min(numbers) <= max(numbers) <= limit:  # e+999 reads as inf
        raise ValueError(f"{key} holds a number beyond the finite range")
    return numbers


def _one(value: str, key: str, low: int, high: int) -> int:
    numbers = _ints(value, key, low, high)
    if len(numbers) != 1:
        raise ValueError(f"{key} holds {_quote(value)}, not one int")
    return numbers[0]


def _quote(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


_Parse = Callable[[str, str], list[Any]]
_COUNT: _Parse = partial(_ints, low=0)
_GAIN: _Parse = partial(_reals, limit=FLOAT32_MAX)  # LightGBM reads split gains as float32
# A numerical tree's lines, in the order LightGBM writes them: each field's parser and length
# ("one" value, one per "node" of the num_leaves - 1, one per leaf of "leaves")
TREE_FIELDS: dict[str, tuple[_Parse, str]] = {
    "num_leaves": (_ints, "one"), "num_cat": (_ints, "one"), "split_feature": (_ints, "node"),
    "split_gain": (_GAIN, "node"), "threshold": (_reals, "node"),
    "decision_type": (_ints, "node"), "left_child": (_ints, "node"),
    "right_child": (_ints, "node"), "leaf_value": (_reals, "leaves"),
    "leaf_weight": (_reals, "leaves"), "leaf_count": (_COUNT, "leaves"),
    "internal_value": (_reals, "node"), "internal_weight": (_reals, "node"),
    "internal_count": (_COUNT, "node"), "is_linear": (_ints, "one"), "shrinkage": (_reals, "one"),
}
# numerical splits: bit 1 default left, bits 2-3 the missing type (none, zero, NaN); bit 0
# (categorical) and missing type 3 are refused
DECISION_TYPES = frozenset({0, 2, 4, 6, 8, 10})
_TREE_LINES = len(TREE_FIELDS) + 3  # Tree=i, the fields, two blank lines

Tree = dict[str, list[Any]]


@dataclass(frozen=True)
class ModelText:
    """The parsed values of a LightGBM model text of one regression output."""

    max_feature_idx: int
    objective: str
    feature_names: list[str]
    feature_infos: list[tuple[float, float] | None]  # a numerical feature's range, or none
    trees: list[Tree]

    def canonical(self) -> str:
        """The model text LightGBM reads, written from the parsed values alone: the header,
        the trees and ``end of trees`` (LightGBM's trailer, the feature importances and the
        training parameters, plays no part in a prediction)."""
        blocks = [f"Tree={index}\n" + "".join(f"{key}={' '.join(map(repr, values))}\n"
                                             for key, values in tree.items()) + "\n\n"
                  for index, tree in enumerate(self.trees)]
        infos = ["none" if info is None else f"[{info[0]!r}:{info[1]!r}]"
                 for info in self.feature_infos]
        header = ["tree", "version=v4", "num_class=1", "num_tree_per_iteration=1",
                  "label_index=0", f"max_feature_idx={self.max_feature_idx}",
                  f"objective={self.objective}", f"feature_names={' '.join(self.feature_names)}",
                  f"feature_infos={' '.join(infos)}",
                  f"tree_sizes={' '.join(str(len(block)) for block in blocks)}", "", ""]
        return "\n".join(header) + "".join(blocks) + END + "\n"


def _header(lines: list[str], n_features: int | None
            ) -> tuple[int, str, list[str], list[tuple[float, float] | None], list[int]]:
    """max_feature_idx, objective, feature names and infos and tree_sizes of a model text's
    first lines: ``tree``, the header fields in LightGBM's order, a blank line."""
    fields = [line.partition("=") for line in lines[1:len(HEADER) + 1]]
    if (lines[:1] != ["tree"] or [key for key, _, _ in fields] != list(HEADER)
            or any(not sep for _, sep, _ in fields) or lines[len(HEADER) + 1:][:1] != [""]):
        raise ValueError(f"it does not start with LightGBM's header (tree, then "
                         f"{', '.join(HEADER)}, in this order)")
    values = {key: value for key, _, value in fields}
    for key, value in _FIXED.items():
        if values[key] != value:
            raise ValueError(f"its {key} is {_quote(values[key])}, not {value} (a LightGBM v4 "
                             "model of one output)")
    if values["objective"] not in OBJECTIVES:
        raise ValueError(f"its objective {_quote(values['objective'])} is not one of "
                         f"{', '.join(OBJECTIVES)}")
    max_feature = _one(values["max_feature_idx"], "max_feature_idx", 0, MAX_FEATURES - 1)
    if n_features is not None and max_feature + 1 != n_features:
        raise ValueError(f"it is a model of {max_feature + 1} features, but the search space "
                         f"has {n_features}")
    names, infos = values["feature_names"], values["feature_infos"]
    if not _NAMES.fullmatch(names) or not _INFOS.fullmatch(infos):
        raise ValueError("its feature_names or feature_infos are not plain names and "
                         "numerical ranges")
    if not len(names.split()) == len(infos.split()) == max_feature + 1:
        raise ValueError(f"its feature_names or feature_infos do not number max_feature_idx "
                         f"+ 1 = {max_feature + 1}")
    ranges = [None if info == "none" else _range(info) for info in infos.split()]
    if values["tree_sizes"].count(" ") >= MAX_TREES:
        raise ValueError(f"its tree_sizes count more than {MAX_TREES:,} trees")
    return (max_feature, values["objective"], names.split(), ranges,
            _ints(values["tree_sizes"], "tree_sizes", 1))


def _range(info: str) -> tuple[float, float]:
    low, high = _reals(info[1:-1].replace(":", " "), "feature_infos")
    return low, high


def _tree(lines: list[str], index: int, max_feature: int, leaves_left: int = MAX_LEAVES
          ) -> Tree:
    """The fields of a tree's lines (after ``Tree=index``), checked; its ``num_leaves`` at most
    ``leaves_left`` before its arrays are parsed."""
    fields = [line.partition("=") for line in lines]
    if [key for key, _, _ in fields] != list(TREE_FIELDS) or any(not sep for _, sep, _ in fields):
        raise ValueError(f"tree {index}: its lines are not a numerical tree's ("
                         f"{', '.join(TREE_FIELDS)}, in this order; categorical and linear "
                         "trees are refused)")
    values = {key: value for key, _, value in fields}
    n = _one(values["num_leaves"], f"tree {index}: num_leaves", 1, MAX_LEAVES)
    if n > leaves_left:
        raise ValueError(f"its trees hold more than {MAX_TOTAL_LEAVES:,} leaves")
    lengths = {"one": 1, "node": n - 1, "leaves": n}
    try:
        tree: Tree = {key: parse(values[key], key) for key, (parse, _) in TREE_FIELDS.items()}
    except ValueError as err:
        raise ValueError(f"tree {index}: {err}") from None
    for key, (_, length) in TREE_FIELDS.items():
        # a one-leaf tree may leave its leaf weight and count out
        if len(tree[key]) != lengths[length] and not (
                n == 1 and key in ("leaf_weight", "leaf_count") and not tree[key]):
            raise ValueError(f"tree {index}: {key} has {len(tree[key])} values for {n} leaves")
    if tree["num_cat"] != [0] or tree["is_linear"] != [0]:
        raise ValueError(f"tree {index} has categorical or linear splits")
    if any(not 0 <= feature <= max_feature for feature in tree["split_feature"]):
        raise ValueError(f"tree {index}: a split_feature is outside 0..max_feature_idx "
                         f"({max_feature})")
    if not DECISION_TYPES.issuperset(tree["decision_type"]):
        raise ValueError(f"tree {index}: a decision_type is not a numerical split's")
    _check_children(tree["left_child"], tree["right_child"], n, index)
    return tree


def _check_children(left: list[int], right: list[int], n: int, index: int) -> None:
    """Raise unless the children form one tree as LightGBM numbers it: every node but the
    root (i > 0) and every leaf (~leaf) a child once, and a node's children after it (so that
    every node descends from the root)."""
    expected = [*range(-n, 0), *range(1, n - 1)] if n > 1 else []  # a leaf alone: none
    if (sorted(left + right) != expected
            or any(0 <= child <= node for node, pair in enumerate(zip(left, right, strict=True))
                   for child in pair)):
        raise ValueError(f"tree {index}: left_child and right_child do not form a tree of "
                         f"{n} leaves")


def parse_model_text(text: str, n_features: int | None = None) -> ModelText:
    """The values of a LightGBM model text of one regression output, parsed by the grammar
    LightGBM writes (module comment); ValueError says why a text is refused. ``n_features``,
    when given, is the feature count the model must have."""
    lines = text.split("\n")
    max_feature, objective, names, infos, sizes = _header(lines, n_features)
    trees: list[Tree] = []
    start, leaves_left = len(HEADER) + 2, MAX_TOTAL_LEAVES
    while lines[start:start + 1] != [END]:
        index = len(trees)
        block = lines[start:start + _TREE_LINES]
        if len(block) != _TREE_LINES or block[0] != f"Tree={index}" or block[-2:] != ["", ""]:
            raise ValueError(f"tree {index} is not one of LightGBM's (Tree={index}, its "
                             f"fields, two blank lines), or '{END}' is missing")
        trees.append(_tree(block[1:-2], index, max_feature, leaves_left))
        leaves_left -= len(trees[-1]["leaf_value"])
        if sizes[index:index + 1] != [sum(len(line) + 1 for line in block)]:
            raise ValueError(f"its tree_sizes do not match tree {index}")
        start += _TREE_LINES
    if not trees or len(trees) != len(sizes):
        raise ValueError("it holds no tree" if not trees else
                         "its tree_sizes do not number its trees")
    if not math.isfinite(sum(max(map(abs, tree["leaf_value"])) for tree in trees)):
        raise ValueError("its leaf values add up beyond the finite range")
    return ModelText(max_feature, objective, names, infos, trees)


def check_model_header(text: str, n_features: int) -> None:
    """Raise ValueError unless the header of a model text (its first lines) is one of
    :func:`parse_model_text` for a model of ``n_features`` features."""
    _header(text.split("\n", len(HEADER) + 2)[:len(HEADER) + 2], n_features)


def booster_from_string(text: str, source: str, fix: str,
                        n_features: int | None = None) -> lgb.Booster:
    """The LightGBM model of ``text`` (read from ``source``): parsed by
    :func:`parse_model_text`, and LightGBM reads its canonical text; :class:`ModelTextError`
    names the source, why, and ``fix``."""
    try:
        return lgb.Booster(model_str=parse_model_text(text, n_features).canonical())
    except (ValueError, lgb.basic.LightGBMError) as err:
        raise ModelTextError(f"{source} is refused as a LightGBM model ({err}): {fix}") from None


def read_booster(path: str | os.PathLike[str], fix: str,
                 n_features: int | None = None) -> lgb.Booster:
    """:func:`booster_from_string` of the file at path."""
    try:
        text = read_outside_bytes(path, fix, MAX_TEXT, ModelTextError).decode("utf-8")
    except UnicodeDecodeError:
        raise ModelTextError(f"{path} is refused as a LightGBM model (not text): {fix}") from None
    return booster_from_string(text, str(path), fix, n_features)
