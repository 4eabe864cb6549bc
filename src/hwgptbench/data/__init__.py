"""The data stage: a text corpus tokenized into token shards.

``corpus`` reads the documents and splits them, ``tokenizer`` trains (or loads) the BPE
tokenizer, ``shards`` writes the shards and reads them back (:class:`TokenShards`, what the
supernet, perplexity and compression stages read). Same params, byte-identical outputs.
"""

from .corpus import (
    Corpus,
    CorpusUnavailableError,
    HuggingFaceCorpus,
    TextFileCorpus,
    open_corpus,
    split_documents,
)
from .shards import MANIFEST, ShardWriter, TokenShards, build, encode_split, token_dtype
from .tokenizer import EOT_TOKEN, TOKENIZER_FILE, load_tokenizer_file, train_bpe

__all__ = ["EOT_TOKEN", "MANIFEST", "TOKENIZER_FILE", "Corpus", "CorpusUnavailableError",
           "HuggingFaceCorpus", "ShardWriter", "TextFileCorpus", "TokenShards", "build",
           "encode_split", "load_tokenizer_file", "open_corpus", "split_documents",
           "token_dtype", "train_bpe"]
