"""The supernet stage: the archs that later stages evaluate (``archs``), and the weight-sharing
supernet trained on them with the sandwich rule (``train``; ``load_supernet`` reads it back).

Importing the package loads neither torch nor the model: ``load_supernet`` imports them on
first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "load_supernet":
        from .train import load_supernet

        return load_supernet
    raise AttributeError(f"module 'hwgptbench.supernet' has no attribute {name!r}")
