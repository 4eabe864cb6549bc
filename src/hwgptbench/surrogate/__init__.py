"""The surrogates stage: one predictor per (metric, device, condition), cross-validated,
calibrated and stored (``stage``; ``commands`` holds the subcommands). The predictor families,
their feature encoding, quality and store are the foundation :mod:`hwgptbench.predictors`."""
