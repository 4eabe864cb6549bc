"""Forward-pass overhead of a sub-network run through the supernet vs its extracted fixed model.

For each case the two forwards (fp32, CPU, torch.inference_mode) are interleaved, alternating
which goes first, after a warm-up; the script prints both medians and supernet / fixed.

    python benchmarks/subnet_overhead.py [--threads 2] [--repeats 30] [--warmup 3] \
        [--params params.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hwgptbench import params
from hwgptbench.model import SuperGPT
from hwgptbench.space import Arch, SearchSpace

VOCAB = 4096  # the tokenizer of params.yaml; also keeps the `s` embedding small
SHAPES = {"tiny": (16, 128), "s": (1, 256)}  # (batch, sequence length)
ROW = "{:<5} {:<8} {:>4} {:>3} {:>3} {:>3} {:>7} {:>11} {:>12} {:>9} {:>6}"


def mid(space: SearchSpace) -> Arch:
    """The arch with the middle choice of every field (the upper one of an even count), bias on."""
    e, n, h, r = (c[len(c) // 2] for c in (space.embed_dim, space.n_layer, space.n_head,
                                           space.mlp_ratio))
    return Arch(e, n, (h,) * n, (r,) * n, True)


def seconds(model: torch.nn.Module, idx: torch.Tensor) -> float:
    start = time.perf_counter()
    model(idx)
    return time.perf_counter() - start


def compare(supernet: SuperGPT, arch: Arch, idx: torch.Tensor, repeats: int,
            warmup: int) -> tuple[float, float]:
    """Median forward seconds of arch through the supernet and as an extracted model."""
    supernet.set_arch(arch)
    fixed = supernet.extract(arch).eval()
    times: dict[str, list[float]] = {"supernet": [], "fixed": []}
    models = {"supernet": supernet, "fixed": fixed}
    for i in range(warmup + repeats):
        order = ("supernet", "fixed") if i % 2 == 0 else ("fixed", "supernet")
        for name in order:
            elapsed = seconds(models[name], idx)
            if i >= warmup:
                times[name].append(elapsed)
    return statistics.median(times["supernet"]), statistics.median(times["fixed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--params", default="params.yaml", help="where the spaces are defined")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, fp32, inference_mode, "
          f"threads={torch.get_num_threads()}, vocab={VOCAB}, "
          f"median of {args.repeats} interleaved repeats after {args.warmup} warm-up")
    print(ROW.format("space", "arch", "E", "L", "h", "r", "B x T", "params", "supernet ms",
                     "fixed ms", "ratio"))
    spaces = params.load(args.params)["spaces"]
    for name, d in ((name, spaces[name]) for name in SHAPES):
        space = SearchSpace.from_dict(name, d)
        torch.manual_seed(0)
        supernet = SuperGPT(space, VOCAB).eval()
        batch, seq_len = SHAPES[name]
        idx = torch.randint(0, VOCAB, (batch, seq_len))
        for case, arch in (("largest", space.largest()), ("mid", mid(space))):
            with torch.inference_mode():
                t_super, t_fixed = compare(supernet, arch, idx, args.repeats, args.warmup)
            print(ROW.format(name, case, arch.embed_dim, arch.n_layer, arch.n_head[0],
                             arch.mlp_ratio[0], f"{batch}x{seq_len}",
                             f"{space.n_params(arch, VOCAB):,}", f"{t_super * 1e3:.2f}",
                             f"{t_fixed * 1e3:.2f}", f"{t_super / t_fixed:.3f}"))


if __name__ == "__main__":
    main()
