"""The supernet stage: the archs that later stages evaluate (``archs``), and the weight-sharing
supernet trained on them with the sandwich rule (``commands``; the loop is the foundation
:mod:`hwgptbench.training`)."""
