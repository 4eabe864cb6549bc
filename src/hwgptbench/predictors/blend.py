"""The blend: an equal-weight ensemble of the other families fitted on the same target.

Its point prediction and interval ends are the means of its members'. It is stored as a
folder beside its members' folders (``{target}/blend/`` next to ``{target}/lightgbm/`` and
``{target}/mlp_ensemble/``) that names them, and loads them from there. Equal weights need
no data of their own: weights fitted to the out-of-fold predictions would be scored on the
rows that chose them. Because every family is cross-validated on the same seeded folds, the
mean of the members' out-of-fold predictions is the blend's out-of-fold prediction, so the
blend is scored like any family and competes in the selection (docs/surrogates.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..io import atomic_write_text, read_json
from ..outputs import make_dirs
from .base import FIX, Surrogate

_MEMBERS = "members.json"
MEMBER_FAMILIES = ("lightgbm", "mlp_ensemble", "linear")  # the fitted families a blend averages


class BlendSurrogate:
    """Mean of fitted surrogates of other families (see module doc)."""

    family: ClassVar[str] = "blend"

    def __init__(self, members: Sequence[Surrogate]) -> None:
        if len(members) < 2 or len({m.family for m in members}) != len(members):
            raise ValueError(f"a blend needs two or more different families, got "
                             f"{[m.family for m in members]}")
        self.members = list(members)

    @property
    def coverage(self) -> float:
        """Nominal coverage of the interval: the members' (the smallest, should they differ)."""
        return min(m.coverage for m in self.members)

    def fit(self, X: np.ndarray, y: np.ndarray) -> BlendSurrogate:
        """Fit every member on X and y."""
        for member in self.members:
            member.fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Mean of the members' point predictions."""
        return np.mean([m.predict(X) for m in self.members], axis=0)

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means of the members' lower and of their upper interval ends."""
        lows, highs = zip(*(m.predict_interval(X) for m in self.members), strict=True)
        return np.mean(lows, axis=0), np.mean(highs, axis=0)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write the members' family names; their models stay in their own sibling folders."""
        folder = make_dirs(folder)
        atomic_write_text(folder / _MEMBERS, json.dumps([m.family for m in self.members]))

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> BlendSurrogate:
        """The blend of the members stored beside folder."""
        from .store import SurrogateFileError, load_surrogate

        folder = Path(folder)
        names = read_json(folder / _MEMBERS, FIX)
        # members are other families' sibling folders: never a blend, so loading is bounded
        if (not isinstance(names, list) or len(names) < 2 or len(set(map(str, names))) != len(names)
                or not set(map(str, names)) <= set(MEMBER_FAMILIES)):
            raise SurrogateFileError(f"{folder / _MEMBERS}: {str(names)[:200]} is not a list of "
                                     f"two or more of the families {', '.join(MEMBER_FAMILIES)}: "
                                     f"{FIX}")
        return cls([load_surrogate(folder.parent / name)[0] for name in names])
