"""The perplexity stage: validation perplexity of the sampled archs with weights inherited
from the supernet (``evaluate``), for the final supernet and each snapshot.

With ``perplexity.source: hwgptbench`` the stage imports HW-GPT-Bench's published perplexities
instead (:mod:`hwgptbench.hwgpt_import`).
"""
