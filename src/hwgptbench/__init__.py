"""hwgptbench: a hardware-aware architecture benchmark for GPT-style language models."""

import os

from .lazy import lazy_exports

__version__ = "0.1.0"
# torch.profiler (the runtime stage's breakdown) otherwise prints a line at each start and stop;
# read when torch loads, so it is set before anything imports torch
os.environ.setdefault("KINETO_LOG_LEVEL", "5")


# keep `import hwgptbench` light: the API and the supernet reader load on first use
__getattr__ = lazy_exports(__name__, {"Benchmark": "api", "load_supernet": "training.train"})
