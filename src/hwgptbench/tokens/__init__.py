"""Tokens: the BPE tokenizer (``tokenizer``: trained or loaded) and the token shards
(``shards``: written by the data stage, read by training, perplexity and compression)."""
