"""The dense model that compression starts from: pretrained here, or a Hugging Face checkpoint.

Either way it is stored as one file (``dense.pt``: the fixed model's config and weights) and is
the largest arch of the compression search space (``compress.space``).

- ``pretrain``: the space's largest arch trained on the corpus with the supernet trainer over
  the one-arch space of that arch (plain training: every step trains the one model), with the
  same checkpoint/resume.
- ``huggingface``: a local LLaMA-family checkpoint (:mod:`hwgptbench.compress.hf`); its
  dims must be those of the space's largest arch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from ..data import TokenShards
from ..io import load_torch, save_torch
from ..model import GPT, GPTConfig
from ..space import Arch, SearchSpace
from ..supernet.train import TrainConfig, load_supernet, train

log = logging.getLogger(__name__)

FORMAT = "hwgptbench-dense/1"
SOURCES = ("pretrain", "huggingface")


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


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dense_space(space: SearchSpace) -> SearchSpace:
    """The one-arch space of a space's largest arch."""
    largest = space.largest()
    if len(set(largest.n_head)) > 1 or len(set(largest.mlp_ratio)) > 1:
        raise ValueError("the largest arch has per-layer dims that differ")
    section = space.to_dict() | {"embed_dim": [largest.embed_dim], "n_layer": [largest.n_layer],
                                 "n_head": [largest.n_head[0]],
                                 "mlp_ratio": [largest.mlp_ratio[0]], "bias": [largest.bias]}
    return SearchSpace.from_dict(f"{space.name}-dense", section)


def pretrain(space: SearchSpace, cfg: TrainConfig, shards: TokenShards, out: str | Path,
             work_dir: str | Path, stop_after: int | None = None) -> Path | None:
    """Train the space's largest arch from scratch; write the dense file ``out`` (None: stopped
    early by ``stop_after``, resumable from ``work_dir``)."""
    work_dir = Path(work_dir)
    one_arch = dense_space(space)
    done = train(cfg, one_arch, shards, work_dir / "trained", work_dir, stop_after)
    if done is None:
        return None
    supernet, _ = load_supernet(done)
    save_dense(supernet.extract(one_arch.largest()), out,
               {"source": "pretrain", "steps": cfg.steps, "space": one_arch.name})
    return Path(out)


def from_huggingface(checkpoint: str | Path, space: SearchSpace, out: str | Path,
                     allow_pickle: bool = False) -> Path:
    """Import a local Hugging Face LLaMA-family checkpoint as the dense file ``out`` (its
    safetensors weights; pickled ``.bin`` weights only with ``allow_pickle``)."""
    from .hf import load_hf_llama

    model = load_hf_llama(checkpoint, block_size=space.block_size, allow_pickle=allow_pickle)
    save_dense(model, out, {"source": "huggingface", "checkpoint": str(checkpoint)})
    return Path(out)
