"""Export of a fixed GPT to every format asked for, each checked against the model's logits:
the entry point of the export package (:func:`export_arch`, :func:`load_source`,
:func:`load_exported`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from ..errors import UserError
from ..io import first_line, load_torch, sha256_file
from ..model import GPT
from ..outputs import check_output_dir, replace_dir
from ..space import Arch
from . import hf, manifest, onnx_export, pt2
from .check import (
    TOLERANCE,
    FormatUnavailableError,
    Logits,
    check_inputs,
    compare,
    reference_logits,
)

log = logging.getLogger(__name__)

FORMATS = ("pt2", "onnx", "hf")
HF_FOLDER = "hf"  # the Hugging Face folder inside an export folder


def _unavailable(fmt: str, model: GPT) -> str | None:
    """Why fmt cannot be written for model here, or None."""
    if fmt == "onnx":
        return onnx_export.unavailable_reason()
    if fmt == "hf":
        return hf.unsupported_reason(model.config)
    return None


class ModelFileError(UserError, ValueError):
    """An exported model file that its library cannot read."""


def _load(fmt: str, folder: Path) -> Logits:
    """ids -> logits of the fmt model in folder; the pt2 archive is checked first (docs/
    security.md), and a file that a library cannot read is a :class:`UserError` naming it."""
    if fmt == "pt2":
        return pt2.load(folder)
    try:
        return onnx_export.load(folder) if fmt == "onnx" else hf.load(folder / HF_FOLDER)
    except (ImportError, UserError):
        raise
    except Exception as err:  # the library's own error for a file it cannot read
        where = folder / (onnx_export.FILE if fmt == "onnx" else HF_FOLDER)
        raise ModelFileError(f"{where} cannot be read as {fmt} ({first_line(err)}): export the "
                             "arch again with `hwgptbench export`") from err


def _write(fmt: str, folder: Path, model: GPT, program: ExportedProgram | None,
           tokenizer_path: str | Path | None) -> list[Path]:
    """Write fmt into folder; the files written."""
    if fmt == "hf":
        return hf.save(model, folder / HF_FOLDER, tokenizer_path)
    assert program is not None  # traced for pt2 and onnx
    return pt2.save(program, folder) if fmt == "pt2" else onnx_export.save(program, folder)


def _selected(formats: Sequence[str] | None, model: GPT, strict: bool = True
              ) -> dict[str, str | None]:
    """Each format to consider and why it is skipped (None: written); raises for a format
    asked for by name that cannot be written, unless not ``strict``."""
    unknown = sorted(set(formats or ()) - set(FORMATS))
    if unknown:
        raise UserError(f"unknown export formats {unknown}; known: {list(FORMATS)}")
    reasons = {fmt: _unavailable(fmt, model) for fmt in (FORMATS if formats is None else formats)}
    refused = {fmt: reason for fmt, reason in reasons.items() if reason}
    if formats is not None and strict and refused:
        raise FormatUnavailableError("; ".join(f"format {fmt}: {reason}"
                                               for fmt, reason in refused.items()))
    return reasons


def export_arch(model: GPT, out_dir: str | Path, formats: Sequence[str] | None = None,
                source: dict[str, Any] | None = None,
                tokenizer_path: str | Path | None = None, strict: bool = True
                ) -> dict[str, Any]:
    """Write model (CPU, fp32; put in eval mode) to the folder out_dir in each format and
    ``manifest.json`` beside the files; returns the manifest.

    formats: names from :data:`FORMATS`, each of which must apply (else
    FormatUnavailableError; with ``strict`` False, those that do not apply are recorded as
    skipped), or None for every one that applies (the others are recorded in the manifest
    with the reason). source: where the model came from, as the manifest records
    it (e.g. the scale or compression name plus :func:`load_source`'s info). tokenizer_path:
    the data stage's ``tokenizer.json``, saved into the Hugging Face folder. out_dir is
    replaced as a whole once every format is written and checked: it must be new, empty or
    an earlier export (its output marker, docs/security.md), never the working directory or a
    parent of it.
    """
    check_output_dir(out_dir, "export")
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError("export runs on the CPU in fp32: pass model.to('cpu', torch.float32)")
    model.eval()
    reasons = _selected(formats, model, strict)
    records: dict[str, dict[str, Any]] = {fmt: {"skipped": reason}
                                          for fmt, reason in reasons.items() if reason}
    todo = [fmt for fmt, reason in reasons.items() if not reason]
    inputs = check_inputs(model)
    expected = reference_logits(model, inputs)
    program, trace_seconds = None, None
    if {"pt2", "onnx"} & set(todo):
        start = time.perf_counter()
        program = pt2.trace(model)
        trace_seconds = time.perf_counter() - start
    with replace_dir(out_dir, "export") as staging:
        for fmt in todo:
            start = time.perf_counter()
            files = _write(fmt, staging, model, program, tokenizer_path)
            record = {"export_seconds": time.perf_counter() - start,
                      **manifest.files_record(files, staging)}
            if fmt == "onnx" and not onnx_export.runtime_available():
                record["check"] = {"skipped": "onnxruntime is not installed: "
                                              f"{onnx_export.INSTALL_HINT}"}
            else:
                record["check"] = compare(_load(fmt, staging), inputs, expected, TOLERANCE[fmt])
                if not record["check"]["passed"]:
                    log.warning("%s: logits differ from the model's by %.3g > %g", fmt,
                                record["check"]["max_abs_diff"], TOLERANCE[fmt])
            log.info("exported %s as %s in %.1f s (%d bytes)", model.config.arch.id, fmt,
                     record["export_seconds"], record["size_bytes"])
            records[fmt] = record
        result = manifest.build(model, source or {}, records, trace_seconds)
        manifest.write(staging, result)
    return result


def open_source(checkpoint_path: str | Path) -> tuple[Callable[[str], GPT], dict[str, Any]]:
    """A supernet file (any of its sub-networks) or a dense model file (its own arch only),
    read once: the function from an arch id to its fixed GPT (CPU, fp32, eval mode), and the
    file's info for the manifest: ``checkpoint``, ``checkpoint_sha256``, ``kind`` (supernet |
    dense), ``space``."""
    from ..model.dense import FORMAT as DENSE_FORMAT
    from ..model.dense import load_dense
    from ..training.train import FORMAT as SUPERNET_FORMAT
    from ..training.train import load_supernet

    path = Path(checkpoint_path)
    header = load_torch(path, "pass a supernet file or the compression's dense.pt", mmap=True)
    kind = header.get("format") if isinstance(header, dict) else None
    del header
    info: dict[str, Any]
    if kind == SUPERNET_FORMAT:
        supernet, space = load_supernet(path)
        info = {"kind": "supernet", "space": space.name}

        def model(arch_id: str) -> GPT:
            return supernet.extract(Arch.from_id(arch_id)).float().eval()
    elif kind == DENSE_FORMAT:
        dense = load_dense(path).float().eval()
        info = {"kind": "dense", "space": None}

        def model(arch_id: str) -> GPT:
            if dense.config.arch != Arch.from_id(arch_id):
                raise UserError(f"{path} is the dense model of arch {dense.config.arch.id}, not "
                                f"{arch_id}: pass its own id, or a supernet file for a "
                                "sub-network")
            return dense
    else:
        raise UserError(f"{path} is neither a supernet file ({SUPERNET_FORMAT}) nor a dense "
                        f"model file ({DENSE_FORMAT}) but format {kind!r}")
    return model, {"checkpoint": str(path), "checkpoint_sha256": sha256_file(path), **info}


def load_source(checkpoint_path: str | Path, arch_id: str) -> tuple[GPT, dict[str, Any]]:
    """The fixed GPT of arch_id and the file's info (:func:`open_source`)."""
    model, info = open_source(checkpoint_path)
    return model(arch_id), info


def load_exported(folder: str | Path, fmt: str) -> Logits:
    """ids (batch, seq) -> logits of the fmt model of an export folder."""
    folder = Path(folder)
    record = manifest.read(folder)["formats"].get(fmt)
    if record is None or "skipped" in record:
        why = record["skipped"] if record else "not asked for"
        raise FormatUnavailableError(f"{folder} holds no {fmt} export: {why}")
    return _load(fmt, folder)
