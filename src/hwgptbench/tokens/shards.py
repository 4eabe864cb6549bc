"""Token shards: the data stage's build and the reader of its output.

A corpus is a sequence of documents. Documents are split into train and validation sets by a
seeded permutation; a byte-level BPE tokenizer is trained on the training documents (or an
existing tokenizer file is used); every document is encoded, followed by the end-of-text
token, and the token stream of each split is written as flat ``uint16``/``uint32`` shard files
(readable with ``numpy.memmap``) with a manifest of token counts and SHA-256 checksums.
Same params, byte-identical outputs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io import sha256_file
from ..outputs import atomic_path

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "hwgptbench-tokens/1"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class ShardWriter:
    """Writes a token stream as consecutive files of at most ``shard_tokens`` tokens."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.buffer = np.empty(shard_tokens, dtype=dtype)
        self.filled = 0
        self.shards: list[dict[str, Any]] = []

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            take = min(len(ids), self.shard_tokens - self.filled)
            self.buffer[self.filled:self.filled + take] = ids[:take]
            self.filled += take
            ids = ids[take:]
            if self.filled == self.shard_tokens:
                self._flush()

    def close(self) -> list[dict[str, Any]]:
        if self.filled or not self.shards:
            self._flush()
        return self.shards

    def _flush(self) -> None:
        name = f"{self.split}_{len(self.shards):03d}.bin"
        path = self.folder / name
        with atomic_path(path) as tmp:
            self.buffer[:self.filled].tofile(tmp)
        self.shards.append({"file": name, "tokens": int(self.filled), "sha256": sha256_file(path)})
        self.filled = 0


@dataclass(frozen=True)
class TokenShards:
    """A finished data-stage output: its manifest and memory-mapped token arrays."""

    folder: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, folder: str | os.PathLike[str], verify: bool = False) -> TokenShards:
        """Open a data-stage output; with ``verify``, check every shard's SHA-256."""
        import json

        folder = Path(folder)
        manifest_path = folder / MANIFEST
        if not manifest_path.exists():
            raise FileNotFoundError(
                f"{folder} is not a finished data-stage output (no {MANIFEST}); run "
                "`hwgptbench data` or `snakemake data` to build it.")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        shards = cls(folder, manifest)
        if verify:
            shards.verify()
        return shards

    def verify(self) -> None:
        """Raise ``ValueError`` if a shard or the tokenizer differs from the manifest."""
        entries = [(s["file"], s["sha256"]) for split in self.manifest["splits"].values()
                   for s in split["shards"]]
        entries.append((self.manifest["tokenizer"]["file"], self.manifest["tokenizer"]["sha256"]))
        for name, expected in entries:
            actual = sha256_file(self.folder / name)
            if actual != expected:
                raise ValueError(f"{self.folder / name}: sha256 {actual} != manifest {expected}")

    def split(self, name: str) -> list[np.memmap]:
        """The shards of split ``name`` ('train' or 'val') as read-only memmaps."""
        dtype = np.dtype(self.manifest["dtype"])
        return [np.memmap(self.folder / s["file"], dtype=dtype, mode="r")
                for s in self.manifest["splits"][name]["shards"]]

    def tokenizer(self) -> Any:
        """The tokenizer the shards were encoded with."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.folder / self.manifest["tokenizer"]["file"]))
