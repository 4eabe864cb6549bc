"""hwgptbench: a hardware-aware architecture benchmark for GPT-style language models."""

import os

__version__ = "0.1.0"
# torch.profiler (the runtime stage's breakdown) otherwise prints a line at each start and stop;
# read when torch loads, so it is set before anything imports torch
os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def __getattr__(name: str):  # keep `import hwgptbench` light: the API loads on first use
    if name == "Benchmark":
        from .api import Benchmark

        return Benchmark
    if name == "load_supernet":
        from .supernet.train import load_supernet

        return load_supernet
    raise AttributeError(f"module 'hwgptbench' has no attribute {name!r}")
