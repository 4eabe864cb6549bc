"""The dense model that compression starts from: pretrained here, or a Hugging Face checkpoint.

Either way it is stored as one file (``dense.pt``: the fixed model's config and weights) and is
the largest arch of the compression search space (``compress.space``).

- ``pretrain``: the space's largest arch trained on the corpus with the supernet trainer over
  the one-arch space of that arch (plain training: every step trains the one model), with the
  same checkpoint/resume.
- ``huggingface``: a local LLaMA-family checkpoint (:mod:`hwgptbench.model.hf`); its
  dims must be those of the space's largest arch.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ..model.dense import save_dense
from ..settings.sections import TrainingSettings
from ..space import SearchSpace
from ..tokens.shards import TokenShards
from ..training.train import load_supernet, train

log = logging.getLogger(__name__)

SOURCES = ("pretrain", "huggingface")


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


def pretrain(space: SearchSpace, cfg: TrainingSettings, shards: TokenShards, out: str | Path,
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
    from ..model.hf import load_hf_llama

    model = load_hf_llama(checkpoint, block_size=space.block_size, allow_pickle=allow_pickle)
    save_dense(model, out, {"source": "huggingface", "checkpoint": str(checkpoint)})
    return Path(out)
