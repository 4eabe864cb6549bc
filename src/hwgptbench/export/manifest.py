"""``manifest.json`` of an export folder: the arch, where it came from, and per format its files,
export time and logits check (or why it was skipped)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import atomic_write_json
from ..model import GPT
from ..versions import library_versions

FILE = "manifest.json"
FORMAT = "hwgptbench-export/1"
LIBRARIES = ("torch", "transformers", "tokenizers", "onnx", "onnxscript", "onnxruntime")


def files_record(files: list[Path], folder: Path) -> dict[str, Any]:
    """Sizes in bytes of a format's files (paths relative to folder) and their total."""
    sizes = {path.relative_to(folder).as_posix(): path.stat().st_size for path in files}
    return {"files": sizes, "size_bytes": sum(sizes.values())}


def build(model: GPT, source: dict[str, Any], formats: dict[str, dict[str, Any]],
          trace_seconds: float | None) -> dict[str, Any]:
    """The manifest of an export of model; ``trace_seconds``: the ``torch.export`` trace that
    pt2 and ONNX share (not in their own ``export_seconds``), None when neither was written."""
    config = model.config
    return {"format": FORMAT, "arch": config.arch.id, "family": config.family,
            "vocab_size": config.vocab_size, "block_size": config.block_size,
            "n_params": sum(p.numel() for p in model.parameters()), "source": source,
            "trace_seconds": trace_seconds, "formats": formats,
            "versions": library_versions(*LIBRARIES)}


def write(folder: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(folder / FILE, manifest)


def read(folder: str | Path) -> dict[str, Any]:
    """The manifest of an export folder; UserError when it is none."""
    path = Path(folder) / FILE
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise UserError(f"{path} cannot be read ({err}): {folder} is no finished export; export "
                        "the arch again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path} is not an export manifest of format {FORMAT}")
    fields = {"arch": str, "family": str, "formats": dict, "vocab_size": int, "block_size": int}
    wrong = [key for key, kind in fields.items() if not isinstance(manifest.get(key), kind)
             or isinstance(manifest.get(key), bool)]
    if wrong or not all(isinstance(r, dict) for r in manifest["formats"].values()):
        raise UserError(f"{path}: {', '.join(wrong) or 'formats'} malformed: {folder} is no "
                        "finished export; export the arch again")
    return manifest
