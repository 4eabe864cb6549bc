"""The data stage's build: a corpus split into train and validation documents, tokenized with
a BPE tokenizer trained on the train split (or loaded), and written as token shards with their
manifest (:func:`build`). Same params, byte-identical outputs."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from .. import __version__
from ..io import canonical_json, sha256_file
from ..outputs import replace_dir
from ..settings.fields import required
from ..settings.sections import DataSettings
from ..tokens.shards import FORMAT, MANIFEST, ShardWriter, token_dtype
from ..tokens.tokenizer import EOT_TOKEN, TOKENIZER_FILE, load_tokenizer_file, train_bpe
from .corpus import Corpus, open_corpus, split_documents

log = logging.getLogger(__name__)
_ENCODE_BATCH = 64  # documents per tokenizer call


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


def build(section: DataSettings, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Run the data stage for the ``data`` params section; write ``out_dir`` atomically.

    Returns the manifest. ``out_dir`` appears only once complete: a killed run leaves at most
    a hidden staging folder, which the next run removes.
    """
    import tokenizers

    corpus = open_corpus(section.corpus)
    split = split_documents(len(corpus), section.val_fraction, section.seed)
    log.info("corpus: %d documents (%d train, %d val)", len(corpus), len(split["train"]),
             len(split["val"]))
    spec = section.tokenizer
    if spec.kind == "bpe":
        log.info("training byte-level BPE tokenizer, vocab %s", spec.vocab_size)
        tokenizer = train_bpe(corpus.texts(split["train"]), len(split["train"]),
                              required(spec.vocab_size, "data.tokenizer.vocab_size"),
                              spec.min_frequency)
    else:
        tokenizer = load_tokenizer_file(required(spec.file, "data.tokenizer.file"))
    vocab_size = tokenizer.get_vocab_size()
    eot_id = tokenizer.token_to_id(EOT_TOKEN)
    dtype = token_dtype(vocab_size)

    with replace_dir(out_dir, "data") as staging:
        tokenizer.save(str(staging / TOKENIZER_FILE))
        splits: dict[str, dict[str, Any]] = {}
        for name, indices in split.items():
            writer = ShardWriter(staging, name, dtype, section.shard_tokens)
            tokens = encode_split(corpus, indices, tokenizer, writer, eot_id)
            splits[name] = {"documents": len(indices), "tokens": tokens, "shards": writer.close()}
            log.info("%s: %d documents, %d tokens, %d shard(s)", name, len(indices), tokens,
                     len(splits[name]["shards"]))
        manifest = {
            "format": FORMAT,
            "name": section.name,
            "corpus": {**section.corpus.model_dump(mode="json", exclude_none=True),
                       **corpus.fingerprint()},
            "tokenizer": {"file": TOKENIZER_FILE, "sha256": sha256_file(staging / TOKENIZER_FILE),
                          "vocab_size": vocab_size, "eot_id": eot_id, "kind": spec.kind},
            "dtype": dtype.name,
            "splits": splits,
            "params": section.model_dump(mode="json", exclude_none=True),
            "versions": {"hwgptbench": __version__, "tokenizers": tokenizers.__version__},
        }
        (staging / MANIFEST).write_text(canonical_json(manifest), encoding="utf-8")
    return manifest
