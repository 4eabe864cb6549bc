"""LightGBM's core (``Booster``, ``Dataset``, ``train``), imported without its scikit-learn
and pandas integrations.

``import lightgbm`` imports scikit-learn and pandas whenever they are installed (for its
estimator classes and DataFrame input): about 2 s of a 2.5 s import on 2 cores, most of a
cached ``hwgptbench query``. This project uses only the core on numpy arrays, so the first
import hides those two packages (unless they are loaded already) and then restores them; in
that process lightgbm's scikit-learn estimators (``LGBMRegressor``) are unavailable.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import UserError

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
# LightGBM's parser trusts its input: a tree whose split_feature exceeds max_feature_idx
# segfaults, an array of the wrong length or a categorical split without its tables aborts the
# process (docs/security.md). So every model text is checked here before LightGBM sees it, and
# only the structure this project writes passes: numerical splits of one regression output,
# every array as long as the tree needs, every node reached once.

MAX_FEATURES = 1_000_000
MAX_LEAVES = 131_072  # LightGBM's own bound on num_leaves
_INTERNAL = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
_INTERNAL_OPTIONAL = ("split_gain", "internal_value", "internal_weight", "internal_count")
_LEAF_OPTIONAL = ("leaf_weight", "leaf_count")
_TREE_KEYS = frozenset({"num_leaves", "num_cat", "leaf_value", "is_linear", "shrinkage",
                        *_INTERNAL, *_INTERNAL_OPTIONAL, *_LEAF_OPTIONAL})


class ModelTextError(UserError, ValueError):
    """A LightGBM model text that is not a plain model of this project's, refused unread."""


def _numbers(text: str, kind: type, key: str) -> list[Any]:
    try:
        return [kind(token) for token in text.split()]
    except ValueError:
        raise ValueError(f"{key} holds a value that is not a{'n int' if kind is int else ' number'}"
                         ) from None


def _check_tree(block: str, index: int, max_feature: int) -> None:
    lines = block.strip("\n").split("\n")
    if lines[0] != f"Tree={index}":
        raise ValueError(f"tree {index} starts with {lines[0][:40]!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition("=")
        if not sep or key not in _TREE_KEYS or key in fields:
            raise ValueError(f"tree {index}: line {line[:40]!r} is not a field of a numerical "
                             "tree (categorical and linear trees are refused)")
        fields[key] = value
    missing = sorted({"num_leaves", "num_cat", "leaf_value", *_INTERNAL} - fields.keys())
    if missing:
        raise ValueError(f"tree {index} lacks {', '.join(missing)}")
    leaves = _numbers(fields["num_leaves"], int, "num_leaves")
    if len(leaves) != 1 or not 1 <= leaves[0] <= MAX_LEAVES:
        raise ValueError(f"tree {index}: num_leaves {fields['num_leaves'][:20]!r}")
    n = leaves[0]
    if fields["num_cat"] != "0" or fields.get("is_linear", "0") != "0":
        raise ValueError(f"tree {index} has categorical or linear splits")
    lengths = {key: n - 1 for key in (*_INTERNAL, *_INTERNAL_OPTIONAL)}
    lengths |= {key: n for key in ("leaf_value", *_LEAF_OPTIONAL)}
    arrays = {}
    for key, length in lengths.items():
        if key not in fields:
            continue
        kind = int if key in ("split_feature", "decision_type", "left_child", "right_child",
                              "internal_count", "leaf_count") else float
        values = _numbers(fields[key], kind, key)
        # one-leaf trees leave the leaf weights out; every other array is exactly as long
        if len(values) != length and not (n == 1 and not values):
            raise ValueError(f"tree {index}: {key} has {len(values)} values for {n} leaves")
        arrays[key] = values
    if any(not 0 <= f <= max_feature for f in arrays["split_feature"]):
        raise ValueError(f"tree {index}: a split_feature is outside 0..max_feature_idx "
                         f"({max_feature})")
    if any(not 0 <= d <= 255 or d & 1 or ((d >> 2) & 3) == 3 for d in arrays["decision_type"]):
        raise ValueError(f"tree {index}: a decision_type is not a numerical split")
    children = arrays["left_child"] + arrays["right_child"]  # node i > 0, or leaf ~c
    if sorted(children) != ([*range(-n, 0), *range(1, n - 1)] if n > 1 else []):
        raise ValueError(f"tree {index}: left_child and right_child do not form a tree of "
                         f"{n} leaves")


def check_model_text(text: str, n_features: int | None = None, trees: bool = True) -> None:
    """Raise ValueError saying why ``text`` is not a model text LightGBM can parse safely:
    header (one output; ``max_feature_idx``, feature names and infos of one count, equal to
    n_features when given), and unless not ``trees`` the trees (numerical splits on features
    0..max_feature_idx, arrays of the lengths num_leaves gives, children forming one tree) and
    ``tree_sizes``, which LightGBM seeks by."""
    head, sep, rest = text.partition("\nTree=")
    if not sep:
        raise ValueError("it holds no tree")
    header: dict[str, str] = {}
    for line in head.split("\n")[1:]:
        key, _, value = line.partition("=")
        header[key] = value
    if head.split("\n")[0] != "tree" or header.get("version") != "v4":
        raise ValueError("it is not a LightGBM v4 model text")
    if header.get("num_class") != "1" or header.get("num_tree_per_iteration") != "1":
        raise ValueError("it is not a model of one output")
    try:
        max_feature = int(header.get("max_feature_idx", ""))
    except ValueError:
        raise ValueError("its max_feature_idx is not an int") from None
    if not 0 <= max_feature < MAX_FEATURES:
        raise ValueError(f"max_feature_idx {max_feature} is out of range")
    if n_features is not None and max_feature + 1 != n_features:
        raise ValueError(f"it is a model of {max_feature + 1} features, but the search space "
                         f"has {n_features}")
    for key in ("feature_names", "feature_infos"):
        if len(header.get(key, "").split()) != max_feature + 1:
            raise ValueError(f"its {key} do not number max_feature_idx + 1 = {max_feature + 1}")
    if not trees:
        return
    trees_text, sep, _ = ("Tree=" + rest).partition("end of trees")
    if not sep:
        raise ValueError("it has no 'end of trees'")
    starts = [m.start() for m in re.finditer(r"^Tree=", trees_text, re.MULTILINE)]
    blocks = [trees_text[a:b] for a, b in zip(starts, [*starts[1:], len(trees_text)],
                                               strict=True)]
    sizes = _numbers(header.get("tree_sizes", ""), int, "tree_sizes")
    if "tree_sizes" in header and sizes != [len(block) for block in blocks]:
        raise ValueError("its tree_sizes do not match its trees")
    for index, block in enumerate(blocks):
        _check_tree(block, index, max_feature)


def booster_from_string(text: str, source: str, fix: str,
                        n_features: int | None = None) -> lgb.Booster:
    """The LightGBM model of ``text`` (read from ``source``), checked by
    :func:`check_model_text` before LightGBM parses it; :class:`ModelTextError` names the
    source, why, and ``fix``."""
    try:
        check_model_text(text, n_features)
        return lgb.Booster(model_str=text)
    except (ValueError, RecursionError, lgb.basic.LightGBMError) as err:
        raise ModelTextError(f"{source} is refused as a LightGBM model ({err}): {fix}") from None


def read_booster(path: str | os.PathLike[str], fix: str,
                 n_features: int | None = None) -> lgb.Booster:
    """:func:`booster_from_string` of the file at path."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelTextError(f"{path} is refused as a LightGBM model (not text): {fix}") from None
    return booster_from_string(text, str(path), fix, n_features)
