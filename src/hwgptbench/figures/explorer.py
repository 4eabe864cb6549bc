"""`hwgptbench explore`: one self-contained HTML page to look at the benchmark in a browser.

Built from the tables shipped with the package and the devices measured or adapted under the
results folder (through :class:`~hwgptbench.api.Benchmark`, as a query reads them): per scale,
every (device, condition) with its measured archs (all rows of its table, status ``ok``) and a
fixed sample of the scale's other archs predicted by the device's surrogates, with their
intervals; each value is marked measured or predicted. The page draws perplexity against a
hardware metric or the parameter count with the Pareto front, compares two devices (the archs
on one front and not the other, Kendall τ over the archs both measured, with n), the τ heatmap
of every two columns, and a sortable table of the front.

Plotly draws it: its JavaScript bundle is inlined (``plotly.offline.get_plotlyjs``), so the
page opens offline, from a file, with no CDN; the page's own script
(:mod:`hwgptbench.figures.explorer_page`) switches the data in the browser.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy.stats import kendalltau

from .. import published
from ..api import Benchmark, QueryError
from ..meters.condition import CONDITION_KEYS, condition_id
from ..metrics import METRICS
from ..outputs import OutputPathError, atomic_path, check_target, marker
from ..schema import fully_trained
from ..space import Arch

log = logging.getLogger(__name__)

COMMAND = "explore"
HARDWARE = ("latency_ms", "energy_mj", "memory_peak_mb")  # the metrics a page offers per device
PREDICTED = 200  # archs of a scale predicted on every device beside its measured ones
MIN_SHARED = 5  # archs two columns must both have measured for a Kendall τ
SEED = 0


def _number(value: Any, digits: int = 5) -> float | None:
    """A finite float rounded to ``digits`` significant digits (the page's size), or None."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _numbers(values: Sequence[Any]) -> list[float | None]:
    return [_number(v) for v in values]


def _arch_row(arch_id: str) -> list[Any]:
    """layers, embedding, heads per layer, MLP ratios per layer, bias (0/1) of an arch."""
    arch = Arch.from_id(arch_id)
    return [arch.n_layer, arch.embed_dim, list(arch.n_head),
            [_number(r, 4) for r in arch.mlp_ratio], int(arch.bias)]


def _sources(bench: Benchmark, scale: str) -> dict[str, str]:
    """Where each device's numbers come from: shipped with the package, measured here, or
    adapted here from a few measured archs (`hwgptbench adapt`)."""
    shipped = set(published.device_tables(scale)) if scale in published.scales() else set()
    adapted = set(bench.index.filter(pl.col("family") == "adapted")["device"])
    here = (set(bench.measurements["device"].drop_nulls())
            if bench.measurements is not None else set()) - shipped
    sources = {}
    for device in sorted(set(bench.devices) | here):
        sources[device] = ("adapted" if device in adapted
                           else "shipped" if device in shipped else "measured here")
    return sources


def _measured_rows(bench: Benchmark) -> pl.DataFrame:
    """The ok rows of the benchmark's measurements: device, condition, arch_id and metrics."""
    table = bench.measurements
    if table is None or "device" not in table.columns:
        return pl.DataFrame(schema={"device": pl.String, "condition": pl.String,
                                    "arch_id": pl.String,
                                    **dict.fromkeys(HARDWARE, pl.Float64)})
    if "status" in table.columns:
        table = table.filter(pl.col("status") == "ok")
    keys = table.select(CONDITION_KEYS).unique()
    ids = [condition_id(**dict(zip(CONDITION_KEYS, key, strict=True)))
           for key in keys.iter_rows()]
    table = table.join(keys.with_columns(condition=pl.Series(ids, dtype=pl.String)),
                       on=list(CONDITION_KEYS), nulls_equal=True)
    columns = [pl.col(m).cast(pl.Float64) if m in table.columns
               else pl.lit(None, dtype=pl.Float64).alias(m) for m in HARDWARE]
    return (table.select("device", "condition", "arch_id", *columns)
            .group_by("device", "condition", "arch_id", maintain_order=True)
            .agg(pl.col(m).drop_nulls().first() for m in HARDWARE))


def _columns(bench: Benchmark, rows: pl.DataFrame) -> list[tuple[str, str]]:
    """Every (device, condition) with a surrogate of a hardware metric or measured rows."""
    fitted = bench.index.filter(pl.col("metric").is_in(HARDWARE)).select("device", "condition")
    return sorted(set(fitted.iter_rows()) | set(rows.select("device", "condition").iter_rows()))


def _predict(bench: Benchmark, ids: list[str], metric: str, device: str | None = None,
             condition: str | None = None) -> tuple[list[Any], list[Any], list[Any]] | None:
    """Point predictions and interval of ``metric`` for ``ids`` (None: no surrogate)."""
    if not ids:
        return [], [], []
    try:
        answer = bench.query(ids, metric, device=device, condition=condition,
                             return_interval=True)
    except QueryError as err:
        log.debug("explore: no %s on %s under %s: %s", metric, device, condition, err)
        return None
    return (answer[metric].to_list(), answer[f"{metric}_lo"].to_list(),
            answer[f"{metric}_hi"].to_list())


def _sample(bench: Benchmark, n: int) -> list[str]:
    """A fixed sample of the scale's archs: of its perplexity table where it has one."""
    if bench.perplexities is not None and "arch_id" in bench.perplexities.columns:
        ids = sorted(set(fully_trained(bench.perplexities)["arch_id"].to_list()))
        return random.Random(SEED).sample(ids, min(n, len(ids)))
    return [arch.id for arch in bench.sample(n, seed=SEED)]


def _values(measured: list[Any], predicted: tuple[list[Any], list[Any], list[Any]] | None,
            missing: list[int]) -> dict[str, list[Any]]:
    """One metric of a column: value, interval (null where measured) and measured flags."""
    value = list(measured)
    low: list[Any] = [None] * len(value)
    high: list[Any] = [None] * len(value)
    if predicted is not None:
        for k, i in enumerate(missing):
            value[i], low[i], high[i] = predicted[0][k], predicted[1][k], predicted[2][k]
    return {"v": _numbers(value), "lo": _numbers(low), "hi": _numbers(high),
            "m": [int(v is not None) for v in measured]}


def kendall_cells(labels: list[str], wide: dict[str, dict[str, float]]
                  ) -> tuple[list[list[float | None]], list[list[int]]]:
    """Kendall τ-b and the number of archs both measured, of every two columns of ``wide``
    (label -> arch id -> value); τ where they share :data:`MIN_SHARED` archs or more."""
    n = len(labels)
    tau: list[list[float | None]] = [[None] * n for _ in range(n)]
    shared = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            a, b = wide[labels[i]], wide[labels[j]]
            both = sorted(set(a) & set(b))
            shared[i][j] = len(both)
            if len(both) >= MIN_SHARED:
                stat = kendalltau([a[k] for k in both], [b[k] for k in both]).statistic
                tau[i][j] = _number(stat, 3)
    return tau, shared


def scale_data(scale: str, results: str | os.PathLike[str], predicted: int = PREDICTED
               ) -> dict[str, Any]:
    """Everything the page shows of one scale (JSON-ready)."""
    bench = Benchmark.load(scale, results)
    rows = _measured_rows(bench)
    sample = _sample(bench, predicted)
    sources = _sources(bench, scale)
    defaults = bench.default_condition
    columns: list[dict[str, Any]] = []
    every: dict[str, None] = {}
    for device, condition in _columns(bench, rows):
        own = rows.filter((pl.col("device") == device) & (pl.col("condition") == condition))
        measured_ids = own["arch_id"].to_list()
        ids = measured_ids + [i for i in sample if i not in set(measured_ids)]
        every.update(dict.fromkeys(ids))
        known = pl.DataFrame({"arch_id": ids}).join(own, on="arch_id", how="left",
                                                    maintain_order="left")
        metrics = {}
        for metric in HARDWARE:
            measured = known[metric].to_list()
            missing = [i for i, v in enumerate(measured) if v is None]
            guess = _predict(bench, [ids[i] for i in missing], metric, device, condition)
            if guess is None and all(v is None for v in measured):
                continue
            metrics[metric] = _values(measured, guess, missing)
        default = (defaults.get(device) if isinstance(defaults, dict) else defaults)
        columns.append({"device": device, "condition": condition,
                        "label": f"{device} {condition}", "source": sources.get(device, ""),
                        "default": condition == default, "rows": len(measured_ids),
                        "ids": ids, "metrics": metrics})
    archs = list(every)
    position = {arch_id: i for i, arch_id in enumerate(archs)}
    for column in columns:
        column["ids"] = [position[i] for i in column["ids"]]
    perplexity = _perplexity(bench, archs)
    params = bench.query(archs, "params")["params"].to_list() if archs else []
    tau: dict[str, Any] = {}
    for metric in HARDWARE:
        wide: dict[str, dict[str, float]] = {}
        for column in columns:
            values = column["metrics"].get(metric)
            if values is None:
                continue
            wide[column["label"]] = {archs[i]: v for i, v, m in zip(
                column["ids"], values["v"], values["m"], strict=True) if m}
        labels = [label for label, values in wide.items() if values]
        if len(labels) >= 1:
            cells, shared = kendall_cells(labels, wide)
            tau[metric] = {"labels": labels, "tau": cells, "n": shared}
    return {"scale": scale, "archs": archs, "config": [_arch_row(a) for a in archs],
            "params": [int(p) for p in params], "perplexity": perplexity,
            "columns": columns, "tau": tau, "predicted": len(sample)}


def _perplexity(bench: Benchmark, archs: list[str]) -> dict[str, list[Any]]:
    """The fully trained perplexity of the archs: measured where the table has it, else
    predicted with its interval."""
    if not archs:
        return {"v": [], "lo": [], "hi": [], "m": []}
    try:
        measured = bench.query(archs, "perplexity", mode="measured")["perplexity"].to_list()
    except QueryError:
        measured = [None] * len(archs)
    missing = [i for i, v in enumerate(measured) if v is None]
    return _values(measured, _predict(bench, [archs[i] for i in missing], "perplexity"), missing)


def metric_info() -> dict[str, dict[str, str]]:
    """Label and unit of each metric the page offers."""
    info = {m: {"label": METRICS[m].label, "unit": METRICS[m].unit} for m in HARDWARE}
    info["params"] = {"label": "parameters (M)", "unit": "M"}
    info["perplexity"] = {"label": "perplexity", "unit": ""}
    return info


def page(data: dict[str, Any]) -> str:
    """The HTML page of ``data`` (:func:`scale_data` per scale), every script inlined."""
    import plotly.offline

    from .explorer_page import BODY, SCRIPT, STYLE

    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # nothing in the JSON can close the script element it is embedded in
    payload = payload.replace("</", "<\\/")
    meta = html.escape(json.dumps(marker(COMMAND), sort_keys=True), quote=True)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta name=\"hwgptbench-output\" content=\"{meta}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<title>hwgptbench explorer</title>\n"
        f"<style>{STYLE}</style>\n"
        f"<script>{plotly.offline.get_plotlyjs()}</script>\n</head>\n<body>\n{BODY}\n"
        f"<script id=\"explorer-data\" type=\"application/json\">{payload}</script>\n"
        f"<script>{SCRIPT}</script>\n</body>\n</html>\n")


def explore(scales: Sequence[str], results: str | os.PathLike[str], out: str | os.PathLike[str],
            predicted: int = PREDICTED) -> Path:
    """Write the explorer page of ``scales`` to ``out`` (checked before anything is read)."""
    check_page(out)
    data = {"scales": {scale: scale_data(scale, results, predicted) for scale in scales},
            "metrics": metric_info(), "min_shared": MIN_SHARED}
    return write_page(page(data), out)


MARKER_META = re.compile(rb'<meta name="hwgptbench-output" content="([^"]*)">')


def page_marker(path: Path) -> Any:
    """The marker in the head of an HTML page this command wrote (None: not ours)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
        found = MARKER_META.search(head)
        return json.loads(html.unescape(found.group(1).decode())) if found else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def check_page(out: str | os.PathLike[str], flag: str = "--out") -> Path:
    """``out`` as a page this command may write: an ``.html`` file, new or an earlier page of
    this command (recognised by the marker in its head)."""
    path = Path(out)
    what = f"file (.html) for hwgptbench {COMMAND}"
    check_target(path, flag, what)
    if path.suffix != ".html":
        raise OutputPathError(f"{flag} {path}: the suffix must name the format written "
                              f"(.html); name a {what}")
    if path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a folder; name a {what}")
    if path.exists() and page_marker(path) != marker(COMMAND):
        raise OutputPathError(f"{flag} {path}: exists and was not written by hwgptbench "
                              f"{COMMAND}; name a new file, or move that one away first")
    return path


def write_page(text: str, out: str | os.PathLike[str], flag: str = "--out") -> Path:
    """Write the page to ``out`` (:func:`check_page`), atomically."""
    path = check_page(out, flag)
    with atomic_path(path, owned=True) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def points(column: dict[str, Any], metric: str) -> int:
    """How many points a column of the page draws for ``metric`` (with a value)."""
    if metric == "params":
        return len(column["ids"])
    values = column["metrics"].get(metric)
    return 0 if values is None else int(np.sum([v is not None for v in values["v"]]))
