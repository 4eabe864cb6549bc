"""The data stage: corpus loading, tokenizer training and token shards.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from . import __version__
from .errors import UserError
from .io import atomic_dir, canonical_json, sha256_file

log = logging.getLogger(__name__)

EOT_TOKEN = "<|endoftext|>"
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "hwgptbench-tokens/1"
_ENCODE_BATCH = 64


class CorpusUnavailableError(UserError, RuntimeError):
    """The configured corpus cannot be read (offline, missing files, bad column)."""


class Corpus(Protocol):
    """An indexable collection of text documents."""

    def __len__(self) -> int: ...

    def texts(self, indices: Sequence[int]) -> Iterator[str]:
        """Yield the documents at ``indices`` (ascending) in that order."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this exact corpus content, for the manifest."""
        ...


@dataclass(frozen=True)
class TextFileCorpus:
    """A folder of UTF-8 text files, one document per file, in sorted path order."""

    files: tuple[Path, ...]

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str], pattern: str) -> TextFileCorpus:
        folder = Path(path)
        files = tuple(sorted(p for p in folder.glob(pattern) if p.is_file()))
        if not files:
            raise CorpusUnavailableError(
                f"data.corpus.path: no files matching '{pattern}' in '{folder}'. Point "
                "data.corpus.path at a folder of .txt files (the embedded corpus is "
                "data/corpora/shakespeare, relative to the repository root).")
        return cls(files)

    def __len__(self) -> int:
        return len(self.files)

    def texts(self, indices: Sequence[int]) -> Iterator[str]:
        for i in indices:
            yield self.files[i].read_text(encoding="utf-8")

    def fingerprint(self) -> dict[str, Any]:
        return {"files": [{"name": f.name, "sha256": sha256_file(f)} for f in self.files]}


class HuggingFaceCorpus:
    """A text column of a Hugging Face `datasets` dataset (memory-mapped Arrow table)."""

    def __init__(self, dataset: Any, text_field: str, spec: dict[str, Any]):
        if text_field not in dataset.column_names:
            raise CorpusUnavailableError(
                f"data.corpus.text_field: column '{text_field}' not in dataset "
                f"'{spec['dataset']}'; its columns are {dataset.column_names}.")
        self.dataset = dataset
        self.text_field = text_field
        self.spec = spec

    @classmethod
    def load(cls, spec: dict[str, Any]) -> HuggingFaceCorpus:
        """Load the dataset named in ``spec`` (the ``data.corpus`` params)."""
        try:
            import datasets

            dataset = datasets.load_dataset(spec["dataset"], spec.get("config"),
                                            split=spec["split"], revision=spec.get("revision"))
        except Exception as exc:  # offline, unknown id, bad split: all end the same way
            raise CorpusUnavailableError(
                f"data.corpus: could not load Hugging Face dataset '{spec['dataset']}' "
                f"(split '{spec['split']}'): {type(exc).__name__}: {exc}\n"
                "If this machine is offline, download the dataset into the Hugging Face cache "
                "on a connected machine first, or use the embedded corpus by setting in "
                "params.yaml:\n  data:\n    corpus: {source: text_files, "
                "path: data/corpora/shakespeare, pattern: '*.txt'}") from exc
        if spec.get("max_documents"):
            dataset = dataset.select(range(min(len(dataset), spec["max_documents"])))
        return cls(dataset, spec["text_field"], spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def texts(self, indices: Sequence[int]) -> Iterator[str]:
        subset = self.dataset.select(indices)
        for batch in subset.iter(batch_size=1000):
            yield from batch[self.text_field]

    def fingerprint(self) -> dict[str, Any]:
        return {"dataset_fingerprint": self.dataset._fingerprint}


def open_corpus(spec: dict[str, Any]) -> Corpus:
    """The corpus described by the ``data.corpus`` params section."""
    if spec["source"] == "text_files":
        return TextFileCorpus.from_folder(spec["path"], spec["pattern"])
    return HuggingFaceCorpus.load(spec)


def split_documents(n_documents: int, val_fraction: float, seed: int) -> dict[str, list[int]]:
    """Seeded split of document indices into train and val (each ascending, both non-empty)."""
    if n_documents < 2:
        raise CorpusUnavailableError(
            f"data.corpus: {n_documents} document(s); at least 2 are needed for a "
            "train/validation split.")
    n_val = min(n_documents - 1, max(1, round(n_documents * val_fraction)))
    permutation = np.random.default_rng(seed).permutation(n_documents)
    val = sorted(int(i) for i in permutation[:n_val])
    train = sorted(int(i) for i in permutation[n_val:])
    return {"train": train, "val": val}


def train_bpe(texts: Iterator[str], n_texts: int, vocab_size: int, min_frequency: int) -> Any:
    """Train a byte-level BPE tokenizer (GPT-2 style pre-tokenisation) on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer, length=n_texts)
    return tokenizer


def load_tokenizer_file(path: str | os.PathLike[str]) -> Any:
    """Load a `tokenizers` JSON file (e.g. GPT-2's tokenizer.json); it must define EOT."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise CorpusUnavailableError(
            f"data.tokenizer.file: cannot load '{path}' as a tokenizers JSON file: {exc}") from exc
    if tokenizer.token_to_id(EOT_TOKEN) is None:
        raise CorpusUnavailableError(
            f"data.tokenizer.file: '{path}' has no '{EOT_TOKEN}' token; the shards separate "
            "documents with it. Use a tokenizer that defines it (GPT-2's does).")
    return tokenizer


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
        self.buffer[:self.filled].tofile(path)
        self.shards.append({"file": name, "tokens": int(self.filled), "sha256": sha256_file(path)})
        self.filled = 0


def encode_split(corpus: Corpus, indices: Sequence[int], tokenizer: Any, writer: ShardWriter,
                 eot_id: int) -> int:
    """Encode the documents at ``indices`` into ``writer``; return the token count."""
    total = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        for encoding in tokenizer.encode_batch(batch):
            ids = np.asarray(encoding.ids + [eot_id], dtype=writer.dtype)
            writer.write(ids)
            total += len(ids)
        batch.clear()

    for text in tqdm(corpus.texts(indices), total=len(indices), desc=f"encode {writer.split}",
                     unit="doc", mininterval=2.0):
        batch.append(text)
        if len(batch) == _ENCODE_BATCH:
            flush()
    flush()
    return total


def build(params: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Run the data stage for the ``data`` params section; write ``out_dir`` atomically.

    Returns the manifest. ``out_dir`` appears only once complete: a killed run leaves at most
    a hidden staging folder, which the next run removes.
    """
    import tokenizers

    corpus = open_corpus(params["corpus"])
    split = split_documents(len(corpus), params["val_fraction"], params["seed"])
    log.info("corpus: %d documents (%d train, %d val)", len(corpus), len(split["train"]),
             len(split["val"]))
    spec = params["tokenizer"]
    if spec["kind"] == "bpe":
        log.info("training byte-level BPE tokenizer, vocab %d", spec["vocab_size"])
        tokenizer = train_bpe(corpus.texts(split["train"]), len(split["train"]),
                              spec["vocab_size"], spec["min_frequency"])
    else:
        tokenizer = load_tokenizer_file(spec["file"])
    vocab_size = tokenizer.get_vocab_size()
    eot_id = tokenizer.token_to_id(EOT_TOKEN)
    dtype = token_dtype(vocab_size)

    with atomic_dir(out_dir) as staging:
        tokenizer.save(str(staging / TOKENIZER_FILE))
        splits = {}
        for name, indices in split.items():
            writer = ShardWriter(staging, name, dtype, params["shard_tokens"])
            tokens = encode_split(corpus, indices, tokenizer, writer, eot_id)
            splits[name] = {"documents": len(indices), "tokens": tokens, "shards": writer.close()}
            log.info("%s: %d documents, %d tokens, %d shard(s)", name, len(indices), tokens,
                     len(splits[name]["shards"]))
        manifest = {
            "format": FORMAT,
            "name": params["name"],
            "corpus": {**params["corpus"], **corpus.fingerprint()},
            "tokenizer": {"file": TOKENIZER_FILE, "sha256": sha256_file(staging / TOKENIZER_FILE),
                          "vocab_size": vocab_size, "eot_id": eot_id, "kind": spec["kind"]},
            "dtype": dtype.name,
            "splits": splits,
            "params": params,
            "versions": {"hwgptbench": __version__, "tokenizers": tokenizers.__version__},
        }
        (staging / MANIFEST).write_text(canonical_json(manifest), encoding="utf-8")
    return manifest


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
