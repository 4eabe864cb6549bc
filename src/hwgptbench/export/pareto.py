"""The workflow's export: the compression's Pareto sub-networks (and any named archs) written
as runnable model files, one folder per arch, with an index table.

Which archs (params ``export``): for each objective set of ``export.pareto``, the sub-networks
on that set's Pareto front among those the compression search evaluated (``subnets.parquet``'s
``pareto_{set}`` flags), at most ``export.max_archs`` of them spread evenly along the front by
parameter count (both ends kept); then the arch ids of ``export.archs``. Each is extracted
from the compression's fine-tuned supernet and written by :func:`~.write.export_arch` in the
formats of ``export.formats`` that apply to it (the others are recorded with the reason), and
its ONNX model is timed against eager PyTorch on the compression's timing input
(:func:`~.onnx_export.latency`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import UserError
from ..io import write_parquet
from ..meters.prefill import prefill_ids
from ..outputs import check_output_dir, replace_dir
from ..settings.compress import TimingSettings
from . import onnx_export
from .write import export_arch, open_source

log = logging.getLogger(__name__)

INDEX = "exports.parquet"  # the index table of an export folder of many archs


def spread(count: int, keep: int) -> list[int]:
    """``keep`` indices of ``range(count)`` spread evenly, both ends included (all if fewer)."""
    if count <= keep:
        return list(range(count))
    if keep == 1:
        return [0]
    return sorted({round(i * (count - 1) / (keep - 1)) for i in range(keep)})


def chosen_archs(subnets: pl.DataFrame, pareto: Sequence[str], max_archs: int,
                 archs: Sequence[str]) -> list[tuple[str, str]]:
    """(arch id, why) of every arch to export (module docstring), each once."""
    chosen: dict[str, str] = {}
    for name in pareto:
        flag = f"pareto_{name}"
        if flag not in subnets.columns:
            known = [c.removeprefix("pareto_") for c in subnets.columns
                     if c.startswith("pareto_")]
            raise UserError(f"export.pareto names objective set {name!r}, which the compression "
                            f"search did not run; choose from {known} (compress.search."
                            "objectives)")
        front = subnets.filter(pl.col(flag)).sort("params")["arch_id"].to_list()
        for index in spread(len(front), max_archs):
            chosen.setdefault(front[index], f"Pareto front of {name}")
    for arch_id in archs:
        chosen.setdefault(arch_id, "export.archs")
    return list(chosen.items())


def export_archs(supernet: str | Path, archs: list[tuple[str, str]], out_dir: str | Path,
                 formats: Sequence[str], tokenizer: str | Path | None,
                 source: dict[str, Any], timing: TimingSettings) -> pl.DataFrame:
    """Export each (arch id, why) of the supernet file to ``out_dir/{arch id}/`` and write the
    index table ``out_dir/exports.parquet`` (one row per arch and format); out_dir is replaced
    as a whole. ``timing``: the compression's (``compress.timing``), for the ONNX Runtime vs
    eager comparison."""
    check_output_dir(out_dir, "export-pareto")
    rows: list[dict[str, Any]] = []
    model_of, info = open_source(supernet)  # read and hashed once for every arch
    with replace_dir(out_dir, "export-pareto") as staging:
        for arch_id, why in archs:
            model = model_of(arch_id)
            folder = staging / arch_id
            manifest = export_arch(model, folder, formats, source | info, tokenizer,
                                   strict=False)
            speed: dict[str, Any] = {}
            if "passed" in manifest["formats"].get("onnx", {}).get("check", {}):
                # written and run by ONNX Runtime: timed against eager PyTorch
                speed = onnx_export.latency(model, folder,
                                            prefill_ids(timing, model.config.vocab_size),
                                            timing, timing.threads)
            for fmt, record in manifest["formats"].items():
                check = record.get("check", {})
                rows.append({
                    "arch_id": arch_id, "why": why, "params": manifest["n_params"],
                    "format": fmt, "skipped": record.get("skipped"),
                    "size_bytes": record.get("size_bytes"),
                    "export_seconds": record.get("export_seconds"),
                    "max_abs_diff": check.get("max_abs_diff"), "passed": check.get("passed"),
                    **({k: speed.get(k) for k in ("onnxruntime_ms", "torch_eager_ms",
                                                  "onnxruntime_vs_eager")}
                       if fmt == "onnx" else {})})
            log.info("exported %s (%s)", arch_id, why)
        index = pl.DataFrame(rows, infer_schema_length=None)
        write_parquet(index, staging / INDEX)
    return index
