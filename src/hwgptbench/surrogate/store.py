"""Saving and loading fitted surrogates with the metadata that says what they predict.

A surrogate folder holds the model's own files plus ``metadata.json``: the feature names, the
search space (name and params.yaml section), the arguments of
:func:`~.features.feature_matrix` used for its features, the metric, device label and
fingerprint, condition, training rows, family and library versions. Folders are written
atomically, so a reader never sees a half-written surrogate.
"""

from __future__ import annotations

import importlib
import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UserError
from ..io import atomic_dir, canonical_json
from ..space import SearchSpace
from . import Surrogate
from .conformal import calibrated
from .features import feature_names

METADATA = "metadata.json"
REQUIRED_KEYS = ("space_name", "space", "feature_args", "metric", "device",
                 "device_fingerprint", "condition", "training_rows")
FEATURE_ARGS = ("vocab_size", "batch_size", "seq_len")
# family -> (module, class), imported on load so that one family never imports another's library.
FAMILIES = {
    "lightgbm": ("hwgptbench.surrogate.lightgbm_model", "LightGBMSurrogate"),
    "mlp_ensemble": ("hwgptbench.surrogate.mlp", "MLPEnsembleSurrogate"),
    "linear": ("hwgptbench.surrogate.linear", "LinearSurrogate"),
    "blend": ("hwgptbench.surrogate.blend", "BlendSurrogate"),  # mean of the others
    "adapted": ("hwgptbench.transfer.model", "AdaptedSurrogate"),  # `hwgptbench adapt`
}


class SurrogateMismatchError(UserError, ValueError):
    """A stored surrogate was fitted on a different search space than the one expected."""


def _space(metadata: dict[str, Any]) -> SearchSpace:
    return SearchSpace.from_dict(metadata["space_name"], metadata["space"])


def save_surrogate(model: Surrogate, folder: str | os.PathLike[str],
                   metadata: dict[str, Any]) -> None:
    """Atomically write model and metadata.json (caller's REQUIRED_KEYS plus derived fields)."""
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    missing += [f"feature_args.{key}" for key in FEATURE_ARGS
                if key not in metadata.get("feature_args", {})]
    if missing:
        raise ValueError(f"surrogate metadata lacks {missing}")
    if model.family not in FAMILIES:
        raise ValueError(f"unknown surrogate family {model.family!r}; known: {sorted(FAMILIES)}")
    document = {
        **metadata,
        "feature_names": feature_names(_space(metadata)),
        "family": model.family,
        "versions": {"hwgptbench": __version__,
                     **{name: version(name) for name in ("lightgbm", "torch", "numpy")}},
    }
    with atomic_dir(folder) as staging:
        model.save(staging)
        (staging / METADATA).write_text(canonical_json(document))


def load_surrogate(folder: str | os.PathLike[str], expected_space: SearchSpace | None = None
                   ) -> tuple[Surrogate, dict[str, Any]]:
    """The model and metadata in folder; SurrogateMismatchError if fitted on another space."""
    folder = Path(folder)
    metadata = json.loads((folder / METADATA).read_text())
    if expected_space is not None and _space(metadata) != expected_space:
        raise SurrogateMismatchError(
            f"surrogate {folder} was fitted on search space {metadata['space_name']!r} "
            f"{metadata['space']}, but search space {expected_space.name!r} "
            f"{expected_space.to_dict()} was expected")
    if metadata["family"] not in FAMILIES:
        raise ValueError(f"surrogate {folder}: unknown family {metadata['family']!r}; "
                         f"known: {sorted(FAMILIES)}")
    module, name = FAMILIES[metadata["family"]]
    model: Surrogate = getattr(importlib.import_module(module), name).load(folder)
    return calibrated(model, folder), metadata
