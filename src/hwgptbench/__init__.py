"""hwgptbench: a hardware-aware architecture benchmark for GPT-style language models."""

__version__ = "0.1.0"
