"""Saving and loading fitted surrogates with the metadata that says what they predict.

A surrogate folder holds the model's own files plus ``metadata.json``: the feature names, the
search space (name and params.yaml section), the arguments of
:func:`~.features.feature_matrix` used for its features, the metric, device label and
fingerprint, condition, training rows, family and library versions; and ``manifest.json``, the
SHA-256 of every other file. Folders are written atomically, so a reader never sees a
half-written surrogate.

:func:`load_surrogate` reads a folder as data (docs/security.md): its files must match the
manifest (a pulled folder already matches ``dvc.lock``; this catches one changed, truncated or
written before the manifest existed), every LightGBM model text is checked against the search
space's feature count before LightGBM parses it (:mod:`hwgptbench.lightgbm_core`), and a file
that its reader refuses is one :class:`SurrogateFileError` naming it and the fix.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UserError
from ..io import CorruptFileError, atomic_dir, canonical_json, read_json, sha256_file
from ..space import SearchSpace
from .base import FIX, Surrogate
from .conformal import calibrated
from .features import feature_names

METADATA = "metadata.json"
MANIFEST = "manifest.json"  # the SHA-256 of every other file of the folder
FORMAT = "hwgptbench-surrogate/2"  # 2: with the manifest
REQUIRED_KEYS = ("space_name", "space", "feature_args", "metric", "device",
                 "device_fingerprint", "condition", "training_rows")
FEATURE_ARGS = ("vocab_size", "batch_size", "seq_len")
# family -> (module, class), imported on load so that one family never imports another's library.
FAMILIES = {
    "lightgbm": ("hwgptbench.predictors.lightgbm_model", "LightGBMSurrogate"),
    "mlp_ensemble": ("hwgptbench.predictors.mlp", "MLPEnsembleSurrogate"),
    "linear": ("hwgptbench.predictors.linear", "LinearSurrogate"),
    "blend": ("hwgptbench.predictors.blend", "BlendSurrogate"),  # mean of the others
    "adapted": ("hwgptbench.transfer.model", "AdaptedSurrogate"),  # `hwgptbench adapt`
}


class SurrogateMismatchError(UserError, ValueError):
    """A stored surrogate was fitted on a different search space than the one expected."""


class SurrogateFileError(UserError, ValueError):
    """A surrogate folder whose files do not match its manifest, or that its readers refuse."""


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
        (staging / MANIFEST).write_text(canonical_json(
            {"format": FORMAT, "files": {name: sha256_file(staging / name)
                                         for name in _files(staging)}}))


def _files(folder: Path) -> list[str]:
    """The files of a surrogate folder but its manifest, as relative POSIX paths."""
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                  if path.is_file() and path.relative_to(folder).as_posix() != MANIFEST)


def verify(folder: str | os.PathLike[str]) -> None:
    """Raise :class:`SurrogateFileError` unless every file of folder is the one its manifest
    names (no file missing, added, changed or truncated)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        if not folder.is_dir():
            raise FileNotFoundError(f"no surrogate folder {folder}: {FIX}")
        raise SurrogateFileError(f"surrogate {folder} has no {MANIFEST} (written before "
                                 f"surrogate folders were checked, or not a surrogate): {FIX}")
    try:
        manifest = read_json(folder / MANIFEST, FIX)
    except CorruptFileError as err:
        raise SurrogateFileError(str(err)) from None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(manifest, dict) or manifest.get("format") != FORMAT
            or not isinstance(listed, dict)):
        raise SurrogateFileError(f"{folder / MANIFEST} is not a surrogate manifest of format "
                                 f"{FORMAT}: {FIX}")
    found = _files(folder)
    odd = sorted(set(found) ^ set(listed))
    if odd:
        how = "not listed in" if odd[0] in found else "missing, though listed in"
        raise SurrogateFileError(f"{folder / odd[0]} is {how} the folder's {MANIFEST}: {FIX}")
    for name in found:
        if sha256_file(folder / name) != listed[name]:
            raise SurrogateFileError(f"{folder / name} does not match its SHA-256 in {MANIFEST} "
                                     f"(changed, corrupt or truncated): {FIX}")


def read_metadata(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata.json of a surrogate folder, its fields checked (:class:`SurrogateFileError`
    names the file otherwise)."""
    path = Path(folder) / METADATA
    try:
        metadata = read_json(path, FIX)
    except CorruptFileError as err:
        raise SurrogateFileError(str(err)) from None
    kinds = {"space_name": str, "space": dict, "feature_args": dict, "metric": str,
             "device": object, "condition": object, "family": str}
    wrong = sorted(key for key, kind in kinds.items() if not isinstance(metadata, dict)
                   or key not in metadata or not isinstance(metadata[key], kind))
    if wrong:
        raise SurrogateFileError(f"{path}: {', '.join(wrong)} missing or malformed: {FIX}")
    try:
        _space(metadata)
    except ValueError as err:
        raise SurrogateFileError(f"{path}: its space is refused ({err}): {FIX}") from None
    return metadata


def load_surrogate(folder: str | os.PathLike[str], expected_space: SearchSpace | None = None
                   ) -> tuple[Surrogate, dict[str, Any]]:
    """The model and metadata in folder, read as data (module doc); SurrogateMismatchError if
    fitted on another space, SurrogateFileError if a file is refused."""
    folder = Path(folder)
    verify(folder)
    metadata = read_metadata(folder)
    space = _space(metadata)
    if expected_space is not None and space != expected_space:
        raise SurrogateMismatchError(
            f"surrogate {folder} was fitted on search space {metadata['space_name']!r} "
            f"{metadata['space']}, but search space {expected_space.name!r} "
            f"{expected_space.to_dict()} was expected")
    if metadata["family"] not in FAMILIES:
        raise SurrogateFileError(f"surrogate {folder}: unknown family {metadata['family']!r}; "
                                 f"known: {sorted(FAMILIES)}")
    _check_lightgbm_headers(folder, len(feature_names(space)))
    module, name = FAMILIES[metadata["family"]]
    try:
        model: Surrogate = getattr(importlib.import_module(module), name).load(folder)
        return calibrated(model, folder), metadata
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RecursionError, OSError) as err:
        # files that match the manifest but not what this version reads
        raise SurrogateFileError(f"surrogate {folder} cannot be read ({type(err).__name__}: "
                                 f"{str(err)[:200]}): {FIX}") from None


def _check_lightgbm_headers(folder: Path, n_features: int) -> None:
    """Refuse a LightGBM model text (``*.txt``) of folder that is not a model of the space's
    feature count; the readers check each tree (:func:`~hwgptbench.lightgbm_core.read_booster`)."""
    texts = [name for name in _files(folder) if name.endswith(".txt")]
    if not texts:
        return
    from ..lightgbm_core import check_model_text

    for name in texts:
        try:
            check_model_text((folder / name).read_text(encoding="utf-8", errors="replace"),
                             n_features, trees=False)
        except ValueError as err:
            raise SurrogateFileError(f"{folder / name} is refused as a LightGBM model ({err}): "
                                     f"{FIX}") from None
