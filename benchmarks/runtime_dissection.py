"""The runtime stage's serving sweep and parallel modes on archs of a paper-scale space, here.

For the smallest, a middle and the largest arch of ``--scale`` (default ``s``, vocabulary
50304): TTFT, TPOT and decode throughput at each ``--batch-sizes`` (a ``--prompt``-token
prompt, ``--gen`` generated tokens), then the train step in each parallel mode (one torchrun
rank per GPU, or ``--cpu-ranks`` gloo ranks without CUDA). Prints both tables and writes them
as CSV under ``--out``.

    python benchmarks/runtime_dissection.py --out /tmp/dissection [--scale s] [--dtype bf16] \
        [--modes none ddp]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import polars as pl
import torch
import yaml

from hwgptbench.meters.device import default_device
from hwgptbench.meters.runner import Settings
from hwgptbench.runtime.parallel import MODES, launch_parallel
from hwgptbench.runtime.rows import measure_condition
from hwgptbench.runtime.serving import serving_sweep
from hwgptbench.runtime.stage import spread_archs
from hwgptbench.space import SearchSpace

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scale", default="s")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--dtype", default="bf16" if torch.cuda.is_available() else "fp32")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--train-batch", type=int, default=4, help="sequences per rank")
    parser.add_argument("--train-seq", type=int, default=256)
    parser.add_argument("--cpu-ranks", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.0, help="timing budget per arch")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="parallel modes of the train step (default: all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    spaces = yaml.safe_load((ROOT / "params.yaml").read_text())["spaces"]
    space = SearchSpace.from_dict(args.scale, spaces[args.scale])
    archs = spread_archs(space.sample(200, seed=0) + [space.smallest(), space.largest()],
                         space, args.vocab, 3)
    device = default_device()
    settings = Settings(threads=torch.get_num_threads(), warmup=3, min_repeats=10,
                        max_repeats=200, target_rel_ci=0.02, max_seconds=args.seconds,
                        energy_seconds=3.0, memory=True, seed=0, estimator="median")
    serving = pl.DataFrame(serving_sweep(
        lambda c: measure_condition(space, archs, args.vocab, c, device, settings),
        args.batch_sizes, args.prompt, args.gen, args.dtype), infer_schema_length=None)
    args.out.mkdir(parents=True, exist_ok=True)
    serving.write_csv(args.out / "serving.csv")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
        print(serving.select("arch_id", "params", "batch_size", "status", "ttft_ms", "tpot_ms",
                             "throughput_tokens_per_s", "memory_peak_mb_decode"))
    tables = launch_parallel(space, archs[:2], args.vocab, modes=args.modes, dtypes=[args.dtype],
                             batch_size=args.train_batch, seq_len=args.train_seq, repeats=5,
                             cpu_ranks=args.cpu_ranks)
    tables.runtime.write_csv(args.out / "parallel.csv")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
        print(tables.runtime.filter(pl.col("rank") == 0).select(
            "arch_id", "mode", "recompute", "world_size", "backend", "status", "step_ms",
            "tokens_per_s", "state_bytes", "memory_peak_mb", "comm_ms", "compute_ms"))


if __name__ == "__main__":
    main()
