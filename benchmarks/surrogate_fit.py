"""Wall time of the surrogate stage on one device table: 1 worker vs several, same results.

    python benchmarks/surrogate_fit.py --measurements results/tiny/measure/DEVICE.parquet \
        [--runtime results/tiny/runtime/DEVICE.parquet] [--workers 2] [--params params.yaml]

Fits every family of every (metric, condition) as the `surrogates_device` rule does, once with
``surrogate.workers: 1`` and once with ``--workers``, into temporary folders, and prints both
wall times, their ratio, and whether the two quality tables are identical.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import device_table
import polars as pl
from polars.testing import assert_frame_equal

from hwgptbench.params import section_of
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.settings.sections import SurrogateSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    device_table.add_arguments(parser)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    config, space, vocab, table = device_table.load(args)
    seconds, quality = {}, {}
    for workers in (1, args.workers):
        section = {**config["surrogate"], "workers": workers}
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            quality[workers] = surrogates.fit_device(section_of(SurrogateSettings, section),
                                                     space, vocab, table, Path(out) / "m")
            seconds[workers] = time.perf_counter() - start
        print(f"workers {workers}: {seconds[workers]:.1f} s, "
              f"{quality[workers].filter(pl.col('status') == 'ok').height} surrogates")
    assert_frame_equal(quality[1], quality[args.workers])
    print(f"speed-up {seconds[1] / seconds[args.workers]:.2f}x; quality tables identical")


if __name__ == "__main__":
    main()
