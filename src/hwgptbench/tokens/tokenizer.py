"""The tokenizer of the data stage: a byte-level BPE trained on the training documents, or an
existing ``tokenizers`` file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ..errors import UserError

EOT_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


class TokenizerUnavailableError(UserError, RuntimeError):
    """A tokenizer file cannot be loaded or lacks the end-of-text token."""


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
        raise TokenizerUnavailableError(
            f"data.tokenizer.file: cannot load '{path}' as a tokenizers JSON file: {exc}") from exc
    if tokenizer.token_to_id(EOT_TOKEN) is None:
        raise TokenizerUnavailableError(
            f"data.tokenizer.file: '{path}' has no '{EOT_TOKEN}' token; the shards separate "
            "documents with it. Use a tokenizer that defines it (GPT-2's does).")
    return tokenizer
