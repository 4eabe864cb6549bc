"""HW-GPT-Bench's perplexity files of a scale as this project's perplexity table.

Each published row is ``{'perplexity', 'accuracy', 'arch': {'sample_embed_dim',
'sample_n_layer', 'sample_layer_indices', 'sample_n_head', 'sample_mlp_ratio',
'sample_bias'}}``: the head and ratio lists have the space's maximum layer count and the
supernet runs the layers ``sample_layer_indices`` in that order, each with its entry of those
lists. An :class:`~hwgptbench.space.Arch` runs the first ``n_layer`` layers, so a row maps to
the arch of its first ``sample_n_layer`` heads and ratios when its indices are exactly
``0 .. n_layer-1`` (every published row); other rows, and rows with a value that is not a
choice of the space, are outside the space: counted by field in the report, not in the table.

The table has the columns of the perplexity stage's (arch_id, params, train_steps, val_loss,
perplexity) plus accuracy (next-token top-1) and source (``repository@commit``). One row per
arch: an arch published more than once gets the mean of its validation losses (the geometric
mean of its perplexities; the perplexity is the exponential of the token-weighted mean loss on
one validation set) and the mean of its accuracies; an arch published once keeps its values.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..hwgpt_source import VOCAB_SIZE, PublishedDataError, files, label
from ..space import Arch, SearchSpace
from .fetch import recorded_source
from .unpickle import load

ARCH_FIELDS = ("sample_embed_dim", "sample_n_layer", "sample_layer_indices", "sample_n_head",
               "sample_mlp_ratio", "sample_bias")
COLUMNS = {"arch_id": pl.String, "params": pl.Int64, "train_steps": pl.Int64,
           "val_loss": pl.Float64, "perplexity": pl.Float64, "accuracy": pl.Float64,
           "source": pl.String}
EXAMPLES = 5  # rows outside the space listed in the report

Kept = dict[str, tuple[Arch, list[tuple[float, float]]]]  # arch id -> arch, (ppl, accuracy)s


def locate(scale: str, folder: str | Path, url: str | None = None, rev: str | None = None
           ) -> tuple[list[tuple[str, Path]], str, str]:
    """The scale's files under ``folder`` as (repository path, local path), and the source
    label and commit: from the files' DVC import pointers, else from ``url`` and ``rev``.
    ``url`` names the repository in the label (e.g. when imported from a local clone)."""
    paths = [(path, Path(folder) / path) for path in files(scale)]
    missing = [str(local) for _, local in paths if not local.exists()]
    if missing:
        raise PublishedDataError(
            f"--files {folder}: {len(missing)} of the {len(paths)} {scale} files are missing "
            f"({missing[0]}, ...): fetch them with `hwgptbench fetch-hwgptbench --scale "
            f"{scale} --out {folder}`")
    recorded = {str(local): recorded_source(local) for _, local in paths}
    sources = set(recorded.values())
    if None in sources and len(sources) > 1:
        unpointed = next(p for p, s in recorded.items() if s is None)
        raise PublishedDataError(f"{unpointed} has no DVC import pointer but other {scale} "
                                 "files have: fetch them all again with hwgptbench "
                                 "fetch-hwgptbench")
    if len(sources) > 1:  # all pointed, as checked above
        pointed = sorted(s for s in sources if s is not None)
        raise PublishedDataError(f"the {scale} files under {folder} were imported from "
                                 f"different sources {pointed}: fetch them all from "
                                 "one (dvc update --rev REV on every pointer)")
    found = sources.pop()
    if found is None:
        if url is None or rev is None:
            raise PublishedDataError(
                f"{paths[0][1]} has no DVC import pointer recording where it came from: "
                f"fetch the files with `hwgptbench fetch-hwgptbench --scale {scale}`, or pass "
                "--source-url and --rev")
        return paths, label(url, rev), rev
    if rev is not None and rev != found[1]:
        raise PublishedDataError(f"--rev {rev}: the files' DVC pointers record commit "
                                 f"{found[1]}; leave --rev out or fetch that revision")
    return paths, label(url or found[0], found[1]), found[1]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PublishedDataError(f"{where}: {value!r} is not a finite number")
    return float(value)


def _list(value: Any, where: str, length: int) -> list[Any]:
    if not isinstance(value, list) or len(value) < length:
        raise PublishedDataError(f"{where}: {value!r} is not a list of at least {length} values")
    return value


def _record(row: Any, where: str) -> tuple[float, float, dict[str, Any]]:
    """(perplexity, accuracy, arch dict) of one published row, its structure checked."""
    if not isinstance(row, dict) or not {"perplexity", "accuracy", "arch"} <= row.keys():
        raise PublishedDataError(f"{where}: expected a dict with perplexity, accuracy and arch, "
                                 f"got {row!r:.200}")
    perplexity = _number(row["perplexity"], f"{where}.perplexity")
    if perplexity < 1:
        raise PublishedDataError(f"{where}.perplexity: {perplexity} < 1 is not a perplexity")
    arch = row["arch"]
    missing = [f for f in ARCH_FIELDS if not isinstance(arch, dict) or f not in arch]
    if missing:
        raise PublishedDataError(f"{where}.arch: missing {', '.join(missing)}")
    n_layer = arch["sample_n_layer"]
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
        raise PublishedDataError(f"{where}.arch.sample_n_layer: {n_layer!r} is not a positive "
                                 "int")
    for field in ("sample_layer_indices", "sample_n_head", "sample_mlp_ratio"):
        _list(arch[field], f"{where}.arch.{field}", n_layer)
    return perplexity, _number(row["accuracy"], f"{where}.accuracy"), arch


def _is_choice(value: Any, choices: tuple[Any, ...], boolean: bool) -> bool:
    """``value in choices``, without taking True for 1 or 1 for True."""
    return isinstance(value, bool) == boolean and value in choices


def _outside(arch: dict[str, Any], space: SearchSpace) -> list[str]:
    """The fields of a published arch that the space (or an Arch) cannot represent."""
    n = arch["sample_n_layer"]
    checks = [("embed_dim", [arch["sample_embed_dim"]], space.embed_dim),
              ("n_layer", [n], space.n_layer),
              ("n_head", arch["sample_n_head"][:n], space.n_head),
              ("mlp_ratio", arch["sample_mlp_ratio"][:n], space.mlp_ratio),
              ("bias", [arch["sample_bias"]], space.bias)]
    fields = [field for field, values, choices in checks
              if not all(_is_choice(v, choices, field == "bias") for v in values)]
    if arch["sample_layer_indices"] != list(range(n)):
        fields.append("layer_indices")  # skips or reorders layers: not an Arch
    return fields


def _to_arch(arch: dict[str, Any]) -> Arch:
    n = arch["sample_n_layer"]
    return Arch(embed_dim=arch["sample_embed_dim"], n_layer=n,
                n_head=tuple(arch["sample_n_head"][:n]),
                mlp_ratio=tuple(arch["sample_mlp_ratio"][:n]), bias=arch["sample_bias"])


def convert(space: SearchSpace, paths: Sequence[tuple[str, Path]], source: str, rev: str,
            train_steps: int = 1, vocab_size: int = VOCAB_SIZE
            ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The perplexity table of the published rows in ``paths`` ((repository path, local
    path) pairs from revision ``rev``), and the import report: rows per file, duplicates,
    rows outside the space by field (with the first few), extra fields ignored."""
    if train_steps < 1:
        raise PublishedDataError(f"--train-steps {train_steps}: must be a positive int")
    kept: Kept = {}
    rows_per_file: dict[str, int] = {}
    outside: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    outside_rows = 0
    ignored: set[str] = set()
    for repo_path, local in paths:
        rows = load(local, rev)
        if not isinstance(rows, list):
            raise PublishedDataError(f"{local} (revision {rev}): expected a list of rows, got "
                                     f"{type(rows).__name__}")
        rows_per_file[repo_path] = len(rows)
        for i, row in enumerate(rows):
            perplexity, accuracy, arch = _record(row, f"{repo_path}[{i}]")
            ignored |= (row.keys() - {"perplexity", "accuracy", "arch"}) | {
                f"arch.{k}" for k in arch.keys() - set(ARCH_FIELDS)}
            fields = _outside(arch, space)
            if fields:
                outside_rows += 1
                outside.update(fields)
                if len(examples) < EXAMPLES:
                    examples.append({"file": repo_path, "row": i, "fields": fields})
                continue
            built = _to_arch(arch)
            kept.setdefault(built.id, (built, []))[1].append((perplexity, accuracy))
    table = _table(space, kept, source, train_steps, vocab_size)
    duplicated = {k: v for k, (_, v) in kept.items() if len(v) > 1}
    report = {
        "scale": space.name, "source": source, "rev": rev, "files": rows_per_file,
        "rows": sum(rows_per_file.values()), "archs": table.height,
        "train_steps": train_steps, "vocab_size": vocab_size,
        "duplicates": {
            "archs": len(duplicated), "extra_rows": sum(len(v) - 1 for v in duplicated.values()),
            "differing": sum(len({p for p, _ in v}) > 1 for v in duplicated.values()),
            "max_relative_spread": max((max(p for p, _ in v) / min(p for p, _ in v) - 1
                                        for v in duplicated.values()), default=0.0),
            "kept": "one row per arch: the mean validation loss (geometric mean perplexity) "
                    "and mean accuracy of its published rows"},
        "outside_space": {"rows": outside_rows, "by_field": dict(sorted(outside.items())),
                          "examples": examples},
        "ignored_fields": sorted(ignored),
    }
    return table, report


def _table(space: SearchSpace, kept: Kept, source: str, train_steps: int, vocab_size: int
           ) -> pl.DataFrame:
    """One row per arch id, in order of first publication."""
    rows = []
    for arch_id, (arch, values) in kept.items():
        losses = [math.log(p) for p, _ in values]
        val_loss = sum(losses) / len(losses)
        rows.append({
            "arch_id": arch_id,
            "params": space.n_params(arch, vocab_size),
            "train_steps": train_steps, "val_loss": val_loss,
            "perplexity": values[0][0] if len(values) == 1 else math.exp(val_loss),
            "accuracy": sum(a for _, a in values) / len(values), "source": source})
    return pl.DataFrame(rows, schema=COLUMNS)


def summary(report: dict[str, Any]) -> str:
    """One log line of an import report."""
    dup, out = report["duplicates"], report["outside_space"]
    fields = ", ".join(f"{k} {v}" for k, v in out["by_field"].items()) or "none"
    return (f"{report['scale']}: {report['rows']} published rows -> {report['archs']} archs; "
            f"{dup['archs']} archs published more than once ({dup['extra_rows']} extra rows, "
            f"{dup['differing']} with differing values, averaged); {out['rows']} rows outside "
            f"the space (by field: {fields}); from {report['source']}")
