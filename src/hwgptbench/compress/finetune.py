"""The dense model as a supernet: importance order, import, and one sandwich-rule fine-tune.

The dense model's heads and MLP channels are ordered by importance on calibration batches of
training windows (:mod:`hwgptbench.compress.importance`), its weights become the supernet's
(the largest sub-network is the dense model exactly), and the supernet is fine-tuned with the
sandwich rule by the supernet trainer, which checkpoints and resumes
(:func:`hwgptbench.training.train.train` with the imported weights as ``init``).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import polars as pl
import torch

from ..io import canonical_json, load_torch, save_torch
from ..model import GPT, SuperGPT
from ..model.dense import load_dense
from ..outputs import atomic_path, make_dirs
from ..settings.compress import ImportanceSettings
from ..settings.sections import TrainingSettings
from ..space import SearchSpace
from ..tokens.shards import TokenShards
from ..training.train import WindowSampler, step_rng, supernet_state, train
from .dense import file_sha256
from .importance import LayerImportance, reorder, unit_importance

log = logging.getLogger(__name__)

IMPORTED = "imported.pt"
IMPORTANCE_TABLE = "importance.parquet"


def calibration_batches(shards: TokenShards, block_size: int, importance: ImportanceSettings
                        ) -> list[torch.Tensor]:
    """Token ids of the calibration batches (training windows, seeded)."""
    sampler = WindowSampler(shards.split("train"), block_size)
    rng = step_rng(importance.seed)
    return [sampler.sample(rng, importance.batch_size)[0] for _ in range(importance.batches)]


def importance_table(scores: list[LayerImportance]) -> pl.DataFrame:
    """One row per unit, in the supernet's order: layer, kind (head | channel), position and
    score (mean residual-stream contribution norm)."""
    rows = [{"layer": layer, "kind": kind, "position": position, "score": float(score)}
            for layer, s in enumerate(scores)
            for kind, values in (("head", s.heads), ("channel", s.channels))
            for position, score in enumerate(values)]
    return pl.DataFrame(rows)


def import_dense(dense: GPT, space: SearchSpace, batches: list[torch.Tensor] | None
                 ) -> tuple[SuperGPT, list[LayerImportance] | None]:
    """The supernet holding dense (reordered by importance on batches first, unless None)."""
    scores = None
    if batches is not None:
        scores = reorder(dense, unit_importance(dense, batches))
    supernet = SuperGPT(space, dense.config.vocab_size)
    supernet.load_dense(dense)
    return supernet, scores


def write_imported(dense_path: str | Path, space: SearchSpace, shards: TokenShards,
                   importance: ImportanceSettings, work_dir: Path) -> Path:
    """Import the dense file into a supernet file in work_dir (reused when it is of the same
    dense file and importance params) and the importance table beside it."""
    fingerprint = hashlib.sha256(canonical_json(
        {"dense": file_sha256(dense_path), "importance": importance.model_dump(mode="json"),
         "space": space.to_dict()}).encode()).hexdigest()
    path = work_dir / IMPORTED
    if path.exists() and load_torch(path, "delete it: it is rebuilt from the dense file",
                                    mmap=True)["fingerprint"] == fingerprint:
        return path
    dense = load_dense(dense_path)
    batches = (calibration_batches(shards, space.block_size, importance)
               if importance.enabled else None)
    supernet, scores = import_dense(dense, space, batches)
    if scores is not None:
        with atomic_path(work_dir / IMPORTANCE_TABLE) as tmp:
            importance_table(scores).write_parquet(tmp)
    save_torch(supernet_state(supernet, space, None, 0, fingerprint), path)
    log.info("imported %s into a supernet of space %r", dense_path, space.name)
    return path


def finetune(dense_path: str | Path, space: SearchSpace, cfg: TrainingSettings,
             shards: TokenShards, importance: ImportanceSettings, out_dir: str | Path,
             work_dir: str | Path, stop_after: int | None = None) -> Path | None:
    """Import and fine-tune; write ``out_dir/supernet.pt``, its loss table and the importance
    table (None: stopped early by ``stop_after``, resumable from ``work_dir``)."""
    out_dir, work_dir = Path(out_dir), Path(work_dir)
    make_dirs(work_dir)
    imported = write_imported(dense_path, space, shards, importance, work_dir)
    done = train(cfg, space, shards, out_dir, work_dir, stop_after, init=imported)
    if done is not None and importance.enabled:
        with atomic_path(out_dir / IMPORTANCE_TABLE) as tmp:
            pl.read_parquet(work_dir / IMPORTANCE_TABLE).write_parquet(tmp)
    return done
