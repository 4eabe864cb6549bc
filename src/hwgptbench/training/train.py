"""Sandwich-rule training of the weight-sharing supernet, with exact checkpoint/resume.

Every step trains the smallest sub-network, ``random_subnets`` uniformly sampled ones and the
largest one on the same batch of ``batch_size`` windows, accumulating their gradients, then
takes one AdamW step (cosine schedule with linear warm-up, gradient clipping). Data windows and
sub-networks of step ``s`` are drawn from generators seeded by ``(seed, s)``, so the run is a
pure function of the params and a resumed run continues exactly where a straight one would be.

At each step of ``snapshots`` the supernet is also saved as it is then
(``supernet-step-{N}.pt``, the format of ``supernet.pt``): the training-step fidelities at
which perplexity is evaluated for multi-fidelity search.

Multi-GPU: launch with ``torchrun --nproc_per_node K`` (``supernet.processes`` = K in the
workflow). ``batch_size`` is the global batch: every rank draws the same ``batch_size`` windows
of the step and takes its own ``batch_size / K`` rows, so with DDP's gradient mean over equal
per-rank batches the run is the single-process run up to float summation order, and its
checkpoint resumes under any process count. All ranks train the same sub-networks; gradients
of all but the last (largest, which uses every parameter) are accumulated under ``no_sync()``.
Each sub-network's loss is averaged over the ranks before it is recorded, so the loss table is
that of the global batch. Only rank 0 writes files. On the CPU, torchrun already starts each
process with one thread (``OMP_NUM_THREADS=1``) unless ``OMP_NUM_THREADS`` is set.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..io import canonical_json, load_torch, save_torch
from ..meters.device import default_device, process_group_backend
from ..model import SuperGPT
from ..outputs import atomic_path, remove_file
from ..settings.sections import TrainingSettings
from ..space import Arch, SearchSpace
from ..tokens.shards import TokenShards

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
SUPERNET = "supernet.pt"
SNAPSHOT = re.compile(r"supernet-step-(\d+)\.pt")
LOSS_TABLE = "loss.parquet"
FORMAT = "hwgptbench-supernet/1"


def snapshot_name(step: int) -> str:
    """File name of the supernet snapshot taken after ``step`` training steps."""
    return f"supernet-step-{step}.pt"


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` → :func:`~hwgptbench.meters.device.default_device` of this rank (its CUDA
    device when CUDA is available, else the CPU; ``$HWGPTBENCH_DEVICE`` overrides)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device; "
                           "set device: auto or cpu")
    if name == "cuda":
        return torch.device("cuda", local_rank)
    if name == "auto":
        return default_device(local_rank)
    return torch.device("cpu")


def step_rng(*key: int) -> np.random.Generator:
    """A generator determined by an integer key, e.g. (seed, step, rank)."""
    return np.random.default_rng(np.random.SeedSequence(list(key)))


class WindowSampler:
    """Random (input, target) windows of ``block_size`` tokens from a split's shards."""

    def __init__(self, shards: Sequence[np.ndarray], block_size: int):
        self.shards = [s for s in shards if len(s) > block_size]
        if not self.shards:
            raise ValueError(f"no shard is longer than block_size {block_size} tokens")
        lengths = np.array([len(s) - block_size for s in self.shards], dtype=np.float64)
        self.weights = lengths / lengths.sum()
        self.block_size = block_size

    def sample(self, rng: np.random.Generator, batch_size: int, rows: slice = slice(None)
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (rows of the batch, block_size) int64, y shifted by one token.

        ``rows`` keeps only those rows of the ``batch_size`` drawn (a rank's share); the
        generator draws the whole batch either way, so a row is the same whatever the share.
        """
        which = rng.choice(len(self.shards), size=batch_size, p=self.weights)
        starts = [int(rng.integers(0, len(self.shards[i]) - self.block_size)) for i in which]
        window = torch.from_numpy(np.stack([
            np.asarray(self.shards[i][start:start + self.block_size + 1], dtype=np.int64)
            for i, start in zip(which[rows], starts[rows], strict=True)]))  # (rows, T + 1)
        return window[:, :-1], window[:, 1:]


def sandwich(space: SearchSpace, n_random: int, seed: int, step: int) -> list[Arch]:
    """The sub-networks of one step: smallest, random ones, largest (last). A space of one
    arch (a dense model) trains just that one."""
    if space.size() == 1:
        return [space.largest()]
    rng_seed = int(step_rng(seed, step, 1).integers(2**31))
    randoms = space.sample(n_random, seed=rng_seed) if n_random else []
    return [space.smallest(), *randoms, space.largest()]


def lr_factor(step: int, cfg: TrainingSettings) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine


def training_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The trainer's mixed precision: bf16 autocast on CUDA, none on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_optimizer(model: torch.nn.Module, cfg: TrainingSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases and norm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas,
                             fused=False, foreach=False)


# the package files a checkpoint's code fingerprint hashes, relative to the package: read as
# data, so `make deps` lists them in the deps of the stages that train
PACKAGE_FILES = ("training/*.py", "space.py", "model/*.py")


def code_fingerprint() -> str:
    """Hash of the source of training, model and space: a code change starts training anew."""
    package = Path(__file__).parents[1]
    digest = hashlib.sha256()
    for pattern in PACKAGE_FILES:
        for path in sorted(package.glob(pattern)):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def run_fingerprint(cfg: TrainingSettings, space: SearchSpace, shards: TokenShards,
                    init: str | None = None) -> str:
    """Hash of everything a checkpoint depends on; a checkpoint of other inputs is not resumed.

    The process count is left out: the run does not depend on it, so a checkpoint resumes
    under another one. ``init`` is the fingerprint of the initial weights, if any.
    """
    train_params = {k: v for k, v in asdict(cfg).items() if k != "processes"}
    key = {"train": train_params, "space": space.to_dict(), "name": space.name, "init": init,
           "code": code_fingerprint(),
           "data": [s["sha256"] for split in shards.manifest["splits"].values()
                    for s in split["shards"]],
           "tokenizer": shards.manifest["tokenizer"]["sha256"]}
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()


@dataclass
class Distributed:
    """This process's place in a torchrun job (world of 1 without torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> Distributed:
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ.get("WORLD_SIZE", 1)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size``: an equal share per rank."""
        if batch_size % self.world_size:
            raise ValueError(f"supernet.batch_size ({batch_size}) is not divisible by the "
                             f"{self.world_size} training processes (WORLD_SIZE); launch a "
                             "number of processes that divides it")
        share = batch_size // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)


SUPERNET_FIX = ("delete it and rerun: the supernet rule trains it again, or `make pull` fetches "
                "it from the DVC remote")


def supernet_state(model: SuperGPT, space: SearchSpace, cfg: TrainingSettings | None, steps: int,
                   fingerprint: str) -> dict[str, Any]:
    """What ``supernet.pt`` and each snapshot hold: the weights after ``steps`` steps, the
    space, vocabulary size, training params (None: weights not trained here, e.g. imported) and
    the run's fingerprint."""
    return {"format": FORMAT, "space_name": space.name, "space": space.to_dict(),
            "vocab_size": model.vocab_size, "train": None if cfg is None else asdict(cfg),
            "steps": steps, "fingerprint": fingerprint, "model": model.state_dict()}


def read_supernet_file(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The contents of a supernet file (``supernet.pt``, a snapshot or imported weights)."""
    state = load_torch(path, SUPERNET_FIX, device)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a supernet file of format {FORMAT}")
    return state


def publish_snapshots(cfg: TrainingSettings, fingerprint: str, work_dir: Path, out_dir: Path
                      ) -> None:
    """Copy this run's snapshots from ``work_dir`` to ``out_dir``; drop others from ``out_dir``."""
    for step in cfg.snapshots:
        source = work_dir / snapshot_name(step)
        state = (load_torch(source, f"delete {work_dir / CHECKPOINT} to train anew")
                 if source.exists() else None)
        if state is None or state["fingerprint"] != fingerprint:
            raise RuntimeError(f"the snapshot of step {step} ({source}) is missing or from "
                               f"another run; delete {work_dir / CHECKPOINT} to train anew")
        save_torch(state, out_dir / snapshot_name(step))
    for path in out_dir.glob("supernet-step-*.pt"):
        match = SNAPSHOT.fullmatch(path.name)
        if match and int(match[1]) not in cfg.snapshots:
            remove_file(path, owned=True)  # a snapshot of its own no longer asked for


def global_mean(values: torch.Tensor, dist: Distributed) -> torch.Tensor:
    """``values`` averaged over the ranks (as is without torchrun)."""
    if dist.world_size > 1:
        values = values.clone()
        torch.distributed.all_reduce(values)  # gloo has no AVG: sum, then divide
        values /= dist.world_size
    return values


def step_history(step: int, archs: list[Arch], losses: torch.Tensor, lr: float
                 ) -> list[dict[str, Any]]:
    """Loss-table rows of one step: one per sub-network, in training order."""
    kinds = (["smallest", *["random"] * (len(archs) - 2)] if len(archs) > 1 else []) + ["largest"]
    return [{"step": step, "kind": kind, "arch_id": arch.id, "loss": loss, "lr": lr}
            for kind, arch, loss in zip(kinds, archs, losses.tolist(), strict=True)]


def train(cfg: TrainingSettings, space: SearchSpace, shards: TokenShards, out_dir: str | Path,
          work_dir: str | Path, stop_after: int | None = None,
          init: str | Path | None = None) -> Path | None:
    """Train (or resume) the supernet; write ``out_dir/supernet.pt``, its snapshots and the loss
    table.

    Resumable checkpoints and snapshots go to ``work_dir`` (kept out of the declared outputs,
    so a workflow engine that deletes incomplete outputs does not delete them). ``stop_after``
    ends the call after that many steps (as if killed right after a checkpoint); returns None
    then. ``init`` is a supernet file of the same space whose weights training starts from
    (fine-tuning an imported model); its vocabulary is the model's.
    """
    dist = Distributed.from_env()
    rows = dist.rows(cfg.batch_size)
    if dist.is_main and dist.world_size != cfg.processes:
        log.warning("training with %d process(es) while supernet.processes is %d: the result "
                    "is the same up to float rounding; supernet.processes only sets how many "
                    "the workflow launches", dist.world_size, cfg.processes)
    device = resolve_device(cfg.device, dist.local_rank)
    if dist.world_size > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(process_group_backend(device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out_dir, work_dir = Path(out_dir), Path(work_dir)
    vocab_size = shards.manifest["tokenizer"]["vocab_size"]
    initial: dict[str, Any] | None = None
    if init is not None:
        initial = read_supernet_file(init, device)
        check_initial(initial, space, vocab_size, init)
        vocab_size = initial["vocab_size"]
    fingerprint = run_fingerprint(cfg, space, shards,
                                  None if initial is None else initial["fingerprint"])

    torch.manual_seed(cfg.seed)
    model = SuperGPT(space, vocab_size).to(device)
    if initial is not None:
        model.load_state_dict(initial["model"])
        del initial
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    history: list[dict[str, Any]] = []
    start = 0
    checkpoint_path = work_dir / CHECKPOINT
    if checkpoint_path.exists():
        state = load_torch(checkpoint_path, "delete it and rerun: training restarts from step 0 "
                           "(an interrupted write never leaves one: it is written atomically)",
                           device)
        if state["fingerprint"] == fingerprint:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            history, start = state["history"], state["step"]
            log.info("resuming from %s at step %d", checkpoint_path, start)
        else:
            log.warning("ignoring %s: it was made with other params or data", checkpoint_path)

    ddp: torch.nn.parallel.DistributedDataParallel | None = None
    if dist.world_size > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    wrapped: torch.nn.Module = model if ddp is None else ddp
    sampler = WindowSampler(shards.split("train"), space.block_size)
    autocast = training_autocast(device)
    end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    model.train()
    for step in tqdm(range(start, end), initial=start, total=cfg.steps, desc="supernet",
                     unit="step", disable=not dist.is_main, mininterval=2.0):
        x, y = (t.to(device) for t in sampler.sample(step_rng(cfg.seed, step, 0),
                                                     cfg.batch_size, rows))
        archs = sandwich(space, cfg.random_subnets, cfg.seed, step)
        losses: list[torch.Tensor] = []
        for i, arch in enumerate(archs):
            model.set_arch(arch)
            last = i == len(archs) - 1
            sync = contextlib.nullcontext() if last or ddp is None else ddp.no_sync()
            with sync:
                with autocast:
                    _, loss = wrapped(x, y)
                loss.backward()
            losses.append(loss.detach().float())
        history.extend(step_history(step, archs, global_mean(torch.stack(losses), dist),
                                    float(scheduler.get_last_lr()[0])))
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        if dist.is_main and done in cfg.snapshots:  # before the checkpoint that passes it
            model.reset_arch()
            save_torch(supernet_state(model, space, cfg, done, fingerprint),
                       work_dir / snapshot_name(done))
        if dist.is_main and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
            model.reset_arch()
            save_torch({"fingerprint": fingerprint, "step": done, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "history": history}, checkpoint_path)
    model.reset_arch()
    if end < cfg.steps:
        return None
    if dist.is_main:
        publish_snapshots(cfg, fingerprint, work_dir, out_dir)
        save_torch(supernet_state(model, space, cfg, cfg.steps, fingerprint), out_dir / SUPERNET)
        with atomic_path(out_dir / LOSS_TABLE) as tmp:
            pl.DataFrame(history).write_parquet(tmp)
    if dist.world_size > 1:
        torch.distributed.barrier()
    return out_dir / SUPERNET


def check_initial(state: dict[str, Any], space: SearchSpace, data_vocab: int,
                  path: str | Path) -> None:
    """Initial weights fit the space, and the data's tokens fit their vocabulary."""
    if SearchSpace.from_dict(state["space_name"], state["space"]) != space:
        raise ValueError(f"initial weights {path} are of search space {state['space_name']!r} "
                         f"{state['space']}, not of {space.name!r} {space.to_dict()}")
    if state["vocab_size"] < data_vocab:
        raise ValueError(f"initial weights {path} have a vocabulary of {state['vocab_size']} "
                         f"tokens, the data's tokenizer {data_vocab}: tokenize the corpus with "
                         "the model's own tokenizer (data.tokenizer.kind: file)")


def load_supernet(path: str | Path, device: str | torch.device = "cpu"
                  ) -> tuple[SuperGPT, SearchSpace]:
    """A trained supernet and its search space, from ``supernet.pt`` or a snapshot."""
    state = read_supernet_file(path, device)
    space = SearchSpace.from_dict(state["space_name"], state["space"])
    model = SuperGPT(space, state["vocab_size"]).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, space


def supernet_files(path: str | Path) -> dict[int, Path]:
    """The supernet file at ``path`` and the snapshots beside it, keyed by training steps."""
    path = Path(path)
    paths = [path, *sorted(p for p in path.parent.iterdir() if SNAPSHOT.fullmatch(p.name))]
    files: dict[int, Path] = {}
    for file in paths:
        steps = load_torch(file, SUPERNET_FIX, mmap=True)["steps"]
        if steps in files:
            raise ValueError(f"{files[steps]} and {file} both hold the supernet after {steps} "
                             "steps")
        files[steps] = file
    return dict(sorted(files.items()))
