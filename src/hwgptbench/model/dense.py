"""A dense model's checkpoint: its config and weights with where it came from (the format that
compression and export read)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from ..io import load_torch, save_torch
from ..model import GPT, GPTConfig
from ..space import Arch

FORMAT = "hwgptbench-dense/1"


def config_to_dict(config: GPTConfig) -> dict[str, Any]:
    """A config as plain data (the arch by its id)."""
    return {**dataclasses.asdict(config), "arch": config.arch.id}


def config_from_dict(data: dict[str, Any]) -> GPTConfig:
    return GPTConfig(**{**data, "arch": Arch.from_id(data["arch"])})


def save_dense(model: GPT, path: str | Path, origin: dict[str, Any]) -> None:
    """Write the dense model file atomically; ``origin`` says where the weights come from."""
    save_torch({"format": FORMAT, "config": config_to_dict(model.config), "origin": origin,
                "model": model.state_dict()}, Path(path))


def load_dense(path: str | Path, device: str | torch.device = "cpu") -> GPT:
    """The dense model of a file written by :func:`save_dense`, in eval mode."""
    state = load_torch(path, "delete it and rerun: the compress rule pretrains it again", device)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dense model file of format {FORMAT}")
    with torch.device(device):
        model = GPT(config_from_dict(state["config"]))
    model.load_state_dict(state["model"])
    return model.eval()
