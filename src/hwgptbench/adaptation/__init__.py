"""Surrogates of a new device from a few measured archs: the transfer methods, the source
devices' models, the targets and the stored ``adapted`` surrogate family. A foundation: the
transfer stage fits and scores them, and every query (``Benchmark``, ``hwgptbench query``)
loads an adapted surrogate through :mod:`hwgptbench.predictors.store`."""
