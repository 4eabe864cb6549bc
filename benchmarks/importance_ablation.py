"""Does the importance order help? Perplexity of sub-networks of a dense model imported into
the supernet with and without the reordering, before any fine-tuning.

Usage: python benchmarks/importance_ablation.py [DENSE] [DATA] [N_ARCHS]
(default: the compression stage's dense model and data of the default params). Prints the
perplexity of the largest arch (the same either way), the median over N seeded archs of
compress.space, and the median ratio reordered / original (< 1: the order helps).
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
import yaml

from hwgptbench.compress.evaluate import mean_loss
from hwgptbench.compress.finetune import calibration_batches, import_dense
from hwgptbench.evaluation.perplexity import validation_batches
from hwgptbench.model.dense import load_dense
from hwgptbench.settings.compress import ImportanceSettings
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards


def main() -> None:
    params = yaml.safe_load(open("params.yaml"))
    section = params["compress"]
    default_dense = f"results/compress/{section['name']}/dense.pt"
    dense_path = sys.argv[1] if len(sys.argv) > 1 else default_dense
    data_dir = sys.argv[2] if len(sys.argv) > 2 else f"results/data/{params['data']['name']}"
    n_archs = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    torch.set_num_threads(section["timing"]["threads"])
    space = SearchSpace.from_dict(section["name"], section["space"])
    shards = TokenShards.open(data_dir)
    val = validation_batches(shards.split("val"), space.block_size, 4, 16, 99)
    device = torch.device("cpu")
    archs = [space.largest(), *space.sample(n_archs, 0)]
    perplexity = {}
    for label, batches in (("original", None), ("reordered", calibration_batches(
            shards, space.block_size, ImportanceSettings.parse(section["importance"])))):
        supernet, _ = import_dense(load_dense(dense_path), space, batches)
        supernet.eval()
        values = []
        for arch in archs:
            supernet.set_arch(arch)
            values.append(math.exp(mean_loss(supernet, val, device)))
        perplexity[label] = np.array(values)
    for label, values in perplexity.items():
        print(f"{label:10s} largest {values[0]:8.2f}  median of {n_archs} archs "
              f"{np.median(values[1:]):10.2f}")
    ratio = perplexity["reordered"][1:] / perplexity["original"][1:]
    print(f"reordered / original perplexity: median {np.median(ratio):.3f}, "
          f"better in {int((ratio < 1).sum())} of {n_archs} archs")


if __name__ == "__main__":
    main()
