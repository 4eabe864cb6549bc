"""Predictors of one metric of an arch with prediction intervals: the common interface and
target transform (``base``), the feature encoding (``features``), the families (``lightgbm_model``,
``mlp``, ``linear``, ``blend``), conformal widening (``conformal``), cross-validated quality
(``quality``) and the store (``store``). The surrogates and transfer stages build on them.
Nothing is imported here: a family's library loads when its module is used."""
