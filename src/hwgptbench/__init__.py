"""hwgptbench: a hardware-aware architecture benchmark for GPT-style language models."""

__version__ = "0.1.0"


def __getattr__(name: str):  # keep `import hwgptbench` light: the API loads on first use
    if name == "Benchmark":
        from .api import Benchmark

        return Benchmark
    raise AttributeError(f"module 'hwgptbench' has no attribute {name!r}")
