"""Quality of a language model: validation perplexity with inherited weights (``perplexity``),
cloze tasks (``tasks``) and the lm-evaluation-harness adapter (``lm_eval_adapter``). The
perplexity, compression and export stages evaluate with them."""
