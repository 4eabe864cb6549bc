"""Corpora of the data stage: a folder of text files or a Hugging Face dataset, and the seeded
split of their documents into train and validation sets."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import UserError
from ..io import sha256_file
from ..settings.fields import required
from ..settings.sections import CorpusSettings


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

    def __init__(self, dataset: Any, text_field: str, spec: CorpusSettings):
        if text_field not in dataset.column_names:
            raise CorpusUnavailableError(
                f"data.corpus.text_field: column '{text_field}' not in dataset "
                f"'{spec.dataset}'; its columns are {dataset.column_names}.")
        self.dataset = dataset
        self.text_field = text_field
        self.spec = spec

    @classmethod
    def load(cls, spec: CorpusSettings) -> HuggingFaceCorpus:
        """Load the dataset named in ``spec`` (the ``data.corpus`` params)."""
        try:
            import datasets

            dataset = datasets.load_dataset(spec.dataset, spec.config, split=spec.split,
                                            revision=spec.revision)
        except Exception as exc:  # offline, unknown id, bad split: all end the same way
            raise CorpusUnavailableError(
                f"data.corpus: could not load Hugging Face dataset '{spec.dataset}' "
                f"(split '{spec.split}'): {type(exc).__name__}: {exc}\n"
                "If this machine is offline, download the dataset into the Hugging Face cache "
                "on a connected machine first, or use the embedded corpus by setting in "
                "params.yaml:\n  data:\n    corpus: {source: text_files, "
                "path: data/corpora/shakespeare, pattern: '*.txt'}") from exc
        if spec.max_documents:
            dataset = dataset.select(range(min(len(dataset), spec.max_documents)))
        return cls(dataset, required(spec.text_field, "data.corpus.text_field"), spec)

    def __len__(self) -> int:
        return len(self.dataset)

    def texts(self, indices: Sequence[int]) -> Iterator[str]:
        subset = self.dataset.select(indices)
        for batch in subset.iter(batch_size=1000):
            yield from batch[self.text_field]

    def fingerprint(self) -> dict[str, Any]:
        return {"dataset_fingerprint": self.dataset._fingerprint}


def open_corpus(spec: CorpusSettings) -> Corpus:
    """The corpus described by the ``data.corpus`` params section."""
    if spec.source == "text_files":
        return TextFileCorpus.from_folder(required(spec.path, "data.corpus.path"),
                                          required(spec.pattern, "data.corpus.pattern"))
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
