"""How far two runs of the workflow agree: the results trees of two checkouts, file by file.

    python benchmarks/compare_results.py ../before ../after

Prints how many result files are byte-identical, and for the others which columns of a table
differ and which fields of a torch file (tensors compared exactly). Measured tables differ
from run to run in their timing columns only; to compare what the code computes from them,
copy one run's device, runtime and breakdown tables into the other
(``results/{scale}/{measure,runtime,breakdown}/``) and rerun ``snakemake figures`` there
first. Logs, the report, params mirrors and work folders are left out.
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import torch

SKIPPED = ("results/logs/", "report.html", ".params/", "/.train/", "/.measure/", "/.dense/",
           "/.finetune/")


def result_files(checkout: Path) -> set[str]:
    return {p.relative_to(checkout).as_posix() for p in (checkout / "results").rglob("*")
            if p.is_file() and not any(s in p.relative_to(checkout).as_posix() for s in SKIPPED)}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def equal(x: Any, y: Any) -> bool:
    """Exact equality of torch file contents: tensors, containers, plain values."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple):
        return isinstance(y, list | tuple) and len(x) == len(y) and all(
            equal(u, v) for u, v in zip(x, y, strict=True))
    return bool(x == y)


def difference(a: Path, b: Path) -> str:
    """What differs between two versions of one result file."""
    if a.suffix == ".parquet":
        ta, tb = pl.read_parquet(a), pl.read_parquet(b)
        if ta.columns != tb.columns or ta.height != tb.height:
            return f"shape {ta.shape} vs {tb.shape}"
        columns = [c for c in ta.columns if not ta[c].equals(tb[c])]
        return f"{len(columns)}/{ta.width} columns differ: {', '.join(columns)}"
    if a.suffix == ".pt":
        da, db = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
        if isinstance(da, dict) and isinstance(db, dict):
            return f"fields that differ: {[k for k in da if not equal(da[k], db.get(k))]}"
        return "equal contents" if equal(da, db) else "contents differ"
    return "bytes differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a checkout after `make run`")
    parser.add_argument("after", type=Path, help="another checkout after `make run`")
    args = parser.parse_args()
    before, after = result_files(args.before), result_files(args.after)
    for name, files in (("only before", before - after), ("only after", after - before)):
        if files:
            print(f"{name}: {sorted(files)}")
    same = sorted(f for f in before & after if digest(args.before / f) == digest(args.after / f))
    differ = sorted(before & after - set(same))
    print(f"{len(same)} of {len(before & after)} files byte-identical")

    def folder(f: str) -> str:
        return "/".join(f.split("/")[:3])

    print("byte-identical, by folder:", dict(Counter(map(folder, same))))
    for f in differ:
        print(f"  {f}: {difference(args.before / f, args.after / f)}")


if __name__ == "__main__":
    main()
