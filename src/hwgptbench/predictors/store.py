"""Saving and loading fitted surrogates with the metadata that says what they predict.

A surrogate folder holds the model's own files plus ``metadata.json``: the feature names, the
search space (name and params.yaml section), the arguments of
:func:`~.features.feature_matrix` used for its features, the metric, device label and
fingerprint, condition, training rows, family and library versions; and ``manifest.json``, the
SHA-256 of every other file. Folders are written atomically, so a reader never sees a
half-written surrogate.

:func:`load_surrogate` reads a folder as data (docs/security.md): its files must match the
manifest (a pulled folder already matches ``dvc.lock``; this catches one changed, truncated or
written before the manifest existed), ``metadata.json`` holds what :func:`save_surrogate`
writes, field by field (:func:`check_metadata`, which the writer applies too), every LightGBM
model text is parsed (:mod:`hwgptbench.lightgbm_core`) with the search space's feature count,
and a file that its reader refuses is one :class:`SurrogateFileError` naming it and the fix.
"""

from __future__ import annotations

import importlib
import math
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UserError
from ..io import CorruptFileError, canonical_json, read_json, sha256_file
from ..layout import DEVICE_LABEL
from ..meters.condition import Condition
from ..metrics import answer_bounds, hardware_metrics
from ..outputs import atomic_dir
from ..schema import ANY
from ..space import SearchSpace
from .base import FIX, Surrogate
from .conformal import CALIBRATION, ConformalSurrogate, calibrated
from .features import feature_names

METADATA = "metadata.json"
MANIFEST = "manifest.json"  # the SHA-256 of every other file of the folder
FORMAT = "hwgptbench-surrogate/2"  # 2: with the manifest
REQUIRED_KEYS = ("space_name", "space", "feature_args", "metric", "device",
                 "device_fingerprint", "condition", "training_rows")
FEATURE_ARGS = ("vocab_size", "batch_size", "seq_len")
# train_steps: a perplexity surrogate's fidelity; ceiling: a latency surrogate's repeatability;
# transfer: how an adapted surrogate was fitted
OPTIONAL_KEYS = ("train_steps", "ceiling", "transfer")
DERIVED_KEYS = ("feature_names", "family", "versions")  # written by save_surrogate itself
# the metrics of the perplexity table, of no device and no condition (api.DEVICE_FREE)
DEVICE_FREE = ("perplexity", "accuracy")
ADAPTED_FAMILY = "adapted"  # the family of `hwgptbench adapt`, kept under the adapted folder
MAX_VOCAB = 1 << 24
MAX_SHAPE = 1 << 20  # a batch size or sequence length: the params schema's bound
# family -> (module, class), imported on load so that one family never imports another's library.
FAMILIES = {
    "lightgbm": ("hwgptbench.predictors.lightgbm_model", "LightGBMSurrogate"),
    "mlp_ensemble": ("hwgptbench.predictors.mlp", "MLPEnsembleSurrogate"),
    "linear": ("hwgptbench.predictors.linear", "LinearSurrogate"),
    "blend": ("hwgptbench.predictors.blend", "BlendSurrogate"),  # mean of the others
    "adapted": ("hwgptbench.adaptation.model", "AdaptedSurrogate"),  # `hwgptbench adapt`
}


class SurrogateMismatchError(UserError, ValueError):
    """A stored surrogate was fitted on a different search space than the one expected."""


class SurrogateFileError(UserError, ValueError):
    """A surrogate folder whose files do not match its manifest, or that its readers refuse."""


def _space(metadata: dict[str, Any]) -> SearchSpace:
    return SearchSpace.from_dict(metadata["space_name"], metadata["space"])


def save_surrogate(model: Surrogate, folder: str | os.PathLike[str],
                   metadata: dict[str, Any]) -> None:
    """Atomically write model and metadata.json (caller's REQUIRED_KEYS, any OPTIONAL_KEYS and
    the DERIVED_KEYS); ValueError if the metadata is not what :func:`check_metadata` reads."""
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
    check_metadata(document)
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


def _positive_int(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _of_strings(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def check_metadata(metadata: Any) -> None:
    """Raise ValueError saying how a surrogate's metadata differs from what
    :func:`save_surrogate` writes: its keys, the space, a known metric and family, a device and
    condition of that metric (``any`` for a metric of the perplexity table; a device label and
    a condition id otherwise) and feature arguments of that condition."""
    if not isinstance(metadata, dict):
        raise ValueError("it is not an object")
    keys = {*REQUIRED_KEYS, *DERIVED_KEYS}
    odd = sorted((keys - metadata.keys()) | (metadata.keys() - keys - set(OPTIONAL_KEYS)))
    if odd:
        raise ValueError(f"missing or unknown fields: {', '.join(odd)}")
    if not isinstance(metadata["space_name"], str) or not isinstance(metadata["space"], dict):
        raise ValueError("space_name or space malformed")
    try:
        space = _space(metadata)
    except (TypeError, ValueError) as err:
        raise ValueError(f"its space is refused ({str(err)[:200]})") from None
    if metadata["feature_names"] != feature_names(space):
        raise ValueError("its feature_names are not those of its space")
    if metadata["family"] not in FAMILIES:
        raise ValueError(f"unknown family {str(metadata['family'])[:40]!r}; known: "
                         f"{', '.join(sorted(FAMILIES))}")
    shape = _check_target(metadata)
    args = metadata["feature_args"]
    if (not isinstance(args, dict) or sorted(args) != sorted(FEATURE_ARGS)
            or not _positive_int(args["vocab_size"], MAX_VOCAB)
            or not all(_positive_int(args[key], MAX_SHAPE) for key in ("batch_size", "seq_len"))):
        raise ValueError(f"feature_args is not vocab_size (1..{MAX_VOCAB}), batch_size and "
                         f"seq_len (1..{MAX_SHAPE})")
    if (args["batch_size"], args["seq_len"]) != (shape or (1, space.block_size)):
        raise ValueError("the batch_size and seq_len of its feature_args are not those of its "
                         "condition")
    if not _positive_int(metadata["training_rows"], 2**63 - 1):
        raise ValueError("training_rows is not a positive int")
    if not isinstance(metadata["device_fingerprint"], dict) or not _of_strings(
            metadata["versions"]):
        raise ValueError("device_fingerprint or versions malformed")
    if not isinstance(metadata.get("ceiling", {}), dict) or not isinstance(
            metadata.get("transfer", {}), dict):
        raise ValueError("ceiling or transfer malformed")


def _check_target(metadata: dict[str, Any]) -> tuple[int, int] | None:
    """Check metric, device, condition and train_steps; the (batch_size, seq_len) of a
    device's condition, None for a metric of the perplexity table."""
    metric, device, condition = (metadata[key] for key in ("metric", "device", "condition"))
    steps = metadata.get("train_steps", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError("train_steps is not an int >= 0")
    if metric in DEVICE_FREE:
        if device != ANY or condition not in (ANY, f"steps-{steps}"):
            raise ValueError(f"a {metric} surrogate has device {ANY!r} and condition {ANY!r} "
                             "or steps-{train_steps}")
        return None
    if metric not in hardware_metrics():
        raise ValueError(f"metric {str(metric)[:40]!r} is none of {', '.join(DEVICE_FREE)} "
                         "and no registered hardware metric (hwgptbench.metrics)")
    if not isinstance(device, str) or device == ANY or not DEVICE_LABEL.fullmatch(device):
        raise ValueError(f"a {metric} surrogate's device {str(device)[:40]!r} is not a device "
                         "label")
    try:
        parsed = Condition.from_id(condition) if isinstance(condition, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(f"a {metric} surrogate's condition {str(condition)[:40]!r} is not a "
                         "condition id")
    return parsed.batch_size, parsed.seq_len


ADAPTED_FIX = "adapt the device again (`hwgptbench adapt`), or delete the folder"


def placement(metadata: dict[str, Any], adapted: bool = False) -> tuple[str, ...]:
    """Where the surrogate of ``metadata`` sits below its root, as its writers place it:
    ``{metric}/{family}`` (``{metric}/steps-N/{family}`` for a lower fidelity) for a metric of
    the perplexity table, ``devices/{device}/{metric}/{condition}/{family}`` under the
    surrogates folder, ``{device}/{metric}/{condition}/adapted`` under the adapted folder."""
    metric, device, condition, family = (metadata[key] for key in
                                         ("metric", "device", "condition", "family"))
    if metric in DEVICE_FREE:
        return (metric, family) if condition == ANY else (metric, condition, family)
    return ((device, metric, condition, family) if adapted
            else ("devices", device, metric, condition, family))


def check_placement(folder: str | os.PathLike[str], root: str | os.PathLike[str],
                    metadata: dict[str, Any], adapted: bool = False) -> None:
    """Raise :class:`SurrogateFileError` unless ``folder`` sits below ``root`` where the
    target of its metadata (metric, device, condition, family) sits (:func:`placement`): a
    folder moved or copied to another device's place, or whose metadata names another device,
    would answer for a device it was not fitted on."""
    folder, root = Path(folder), Path(root)
    try:
        where = folder.relative_to(root).parts
    except ValueError:
        where = ()
    expected = placement(metadata, adapted)
    if where == expected and (metadata["family"] == ADAPTED_FAMILY) == adapted:
        return
    target = (f"{metadata['metric']} on {metadata['device']} under {metadata['condition']}"
              if metadata["metric"] not in DEVICE_FREE else metadata["metric"])
    kind = "an adapted device's" if adapted else "a surrogates"
    raise SurrogateFileError(
        f"{folder}: its {METADATA} says it is the {metadata['family']} surrogate of {target}, "
        f"which {kind} folder keeps in {root.joinpath(*expected)}, not here (moved, copied or "
        f"relabelled from another device or condition): delete {folder}, then "
        f"{ADAPTED_FIX if adapted else FIX}")


def read_metadata(folder: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                  adapted: bool = False) -> dict[str, Any]:
    """The metadata.json of a surrogate folder, checked by :func:`check_metadata`
    (:class:`SurrogateFileError` names the file, why and the fix otherwise); with ``root``,
    also where the folder sits below it (:func:`check_placement`; ``adapted``: the adapted
    devices' folder)."""
    path = Path(folder) / METADATA
    try:
        metadata = read_json(path, FIX)
        check_metadata(metadata)
    except CorruptFileError as err:
        raise SurrogateFileError(str(err)) from None
    except ValueError as err:
        raise SurrogateFileError(f"{path} is not a surrogate's metadata ({err}): {FIX}"
                                 ) from None
    assert isinstance(metadata, dict)  # check_metadata passed it
    if root is not None:
        check_placement(folder, root, metadata, adapted)
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
    _check_lightgbm_headers(folder, len(feature_names(space)))
    module, name = FAMILIES[metadata["family"]]
    try:
        model: Surrogate = getattr(importlib.import_module(module), name).load(folder)
        return _check_widening(calibrated(model, folder), folder, metadata["metric"]), metadata
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RecursionError, OSError) as err:
        # files that match the manifest but not what this version reads
        raise SurrogateFileError(f"surrogate {folder} cannot be read ({type(err).__name__}: "
                                 f"{str(err)[:200]}): {FIX}") from None


def _check_widening(model: Surrogate, folder: Path, metric: str) -> Surrogate:
    """``model`` if its conformal widening moves an interval end by less than the whole range
    of the metric's values (:func:`~hwgptbench.metrics.answer_bounds`; in log space, by less
    than the log of its ratio: 22 for a latency), else :class:`SurrogateFileError` (a widening
    of 1e308 made every interval [0, inf], one of -50 collapsed each onto its point)."""
    bounds = answer_bounds(metric)
    if not isinstance(model, ConformalSurrogate) or bounds is None:
        return model
    if model.log_space:
        span = math.log(bounds.high / bounds.low) if bounds.low > 0 else math.inf
    else:
        span = bounds.high - bounds.low
    if abs(model.by) > span:
        raise SurrogateFileError(f"{folder / CALIBRATION}: widening {model.by:g} "
                                 f"{'(log space) ' if model.log_space else ''}is beyond the "
                                 f"range of any {metric} ({bounds.words}): {FIX}")
    return model


def _check_lightgbm_headers(folder: Path, n_features: int) -> None:
    """Refuse a LightGBM model text (``*.txt``) of folder that is not a model of the space's
    feature count; the readers parse each whole (:func:`~hwgptbench.lightgbm_core.read_booster`)."""
    texts = [name for name in _files(folder) if name.endswith(".txt")]
    if not texts:
        return
    from ..lightgbm_core import check_model_header

    for name in texts:
        try:
            check_model_header((folder / name).read_text(encoding="utf-8", errors="replace"),
                               n_features)
        except ValueError as err:
            raise SurrogateFileError(f"{folder / name} is refused as a LightGBM model ({err}): "
                                     f"{FIX}") from None
