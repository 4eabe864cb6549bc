"""The data stage: a text corpus (``corpus``) tokenized into token shards (``commands``). The
tokenizer and the shards' reader and writer are the foundation :mod:`hwgptbench.tokens`. Same
params, byte-identical outputs."""
