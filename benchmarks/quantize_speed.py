"""Forward latency and size of quantized project GPTs relative to fp32, on the CPU.

For each size (gpt_neox family, 4 layers, head size 64, MLP ratio 4, bias; vocab 4096, whose
tied LM head stays fp32) the fp32 model and every method that runs here
(:func:`hwgptbench.meters.quantize.unsupported_reason`) are timed interleaved
(``measure_latency_interleaved``, torch.inference_mode, one prefill of batch x seq tokens); the
script prints each median, its speedup over fp32 (fp32 ms / ms: > 1 is faster), how many times
smaller the serialized state_dict and the Linear weights alone are than fp32's, and the reason of
each method that cannot run.

    python benchmarks/quantize_speed.py [--threads 2] [--embed 128 256 512] [--seq 128]
"""

from __future__ import annotations

import argparse
import logging

import torch

from hwgptbench.meters.latency import measure_latency_interleaved
from hwgptbench.meters.quantize import (
    METHODS,
    backend_of,
    linear_weight_bytes,
    model_size_bytes,
    quantize,
    unsupported_reason,
)
from hwgptbench.model import GPT, GPTConfig
from hwgptbench.space import SearchSpace

VOCAB = 4096  # the tokenizer of params.yaml
HEAD_SIZE = 64
ROW = "{:>5} {:<17} {:>9} {:>6} {:>8} {:>9} {:>9} {:>15}"


def build(embed_dim: int, n_layer: int, seq_len: int) -> GPT:
    """A seeded fp32 project GPT of one width."""
    n_head = embed_dim // HEAD_SIZE
    space = SearchSpace.from_dict(f"e{embed_dim}", {
        "embed_dim": [embed_dim], "n_layer": [n_layer], "n_head": [n_head], "mlp_ratio": [4],
        "bias": [True], "head_size": HEAD_SIZE, "block_size": seq_len, "rotary_fraction": 0.25})
    torch.manual_seed(0)
    return GPT(GPTConfig.from_space(space, space.largest(), vocab_size=VOCAB)).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embed", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--max-seconds", type=float, default=15.0, help="per model and size")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    methods = [m for m in METHODS if m != "none"]
    runnable = [m for m in methods if unsupported_reason(m, device, torch.float32) is None]
    print(f"torch {torch.__version__}, CPU fp32, threads={torch.get_num_threads()}, "
          f"batch {args.batch} x seq {args.seq}, {args.layers} layers, vocab {VOCAB}; "
          "interleaved medians (95% CI half-width of the median)")
    for method in methods:
        reason = unsupported_reason(method, device, torch.float32)
        print(f"  {method}: {backend_of(method) if reason is None else 'skipped: ' + reason}")
    print(ROW.format("E", "method", "ms", "CI %", "speedup", "size", "linears",
                     "shrink all/lin"))
    for embed_dim in args.embed:
        model = build(embed_dim, args.layers, args.seq)
        x = torch.randint(0, VOCAB, (args.batch, args.seq))
        models = {"fp32": model, **{m: quantize(model, m, x) for m in runnable}}

        def forward(m: torch.nn.Module, x: torch.Tensor = x) -> torch.Tensor:
            with torch.inference_mode():
                return m(x)

        stats = measure_latency_interleaved(
            [lambda m=m: forward(m) for m in models.values()], device, warmup=3, min_repeats=15,
            max_repeats=300, target_rel_ci=0.01, max_seconds=args.max_seconds)
        base_ms, base_size = stats[0]["latency_ms"], model_size_bytes(model)
        base_linear = linear_weight_bytes(model)
        for (name, m), row in zip(models.items(), stats, strict=True):
            size, linear = model_size_bytes(m), linear_weight_bytes(m)
            print(ROW.format(embed_dim, name, f"{row['latency_ms']:.2f}",
                             f"{row['latency_ci95_rel'] * 100:.1f}",
                             f"{base_ms / row['latency_ms']:.2f}x", f"{size / 2**20:.2f}MB",
                             f"{linear / 2**20:.2f}MB",
                             f"{base_size / size:.2f}/{base_linear / linear:.2f}"))


if __name__ == "__main__":
    main()
