"""Time a query of the shipped tables from a fresh results folder: the first (which fits the
scale's surrogates) and a later one (which reads them), each in a new process, as a user's
`hwgptbench query` runs.

    python benchmarks/published_query.py                 # s, m and l
    python benchmarks/published_query.py --scale s --repeats 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hwgptbench import published


def _query(scale: str, results: Path, metrics: list[str]) -> float:
    """Seconds of one `hwgptbench query` process."""
    arch = published.perplexity_table(scale)["arch_id"][0]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hwgptbench.cli", "query", "--scale", scale,
                    "--results", str(results), *[f"--metric={m}" for m in metrics],
                    "--arch", arch], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", nargs="+", default=published.scales())
    parser.add_argument("--repeats", type=int, default=3, help="later queries timed")
    args = parser.parse_args()
    print("scale  first query (fits)  later queries (min / max)  metrics")
    for scale in args.scale:
        metrics = ["perplexity"] + (["latency_ms"] if published.device_tables(scale) else [])
        with tempfile.TemporaryDirectory() as folder:
            first = _query(scale, Path(folder), metrics)
            later = [_query(scale, Path(folder), metrics) for _ in range(args.repeats)]
        print(f"{scale:5}  {first:17.1f} s  {min(later):10.2f} / {max(later):.2f} s       "
              f"{', '.join(metrics)}")


if __name__ == "__main__":
    main()
