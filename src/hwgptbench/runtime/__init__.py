"""The runtime stage: how a model is run changes its cost.

``workloads`` builds what is timed (prefill, decode, a train step) under runtime options
(attention backend, int8, recompute, compile), ``breakdown`` attributes the time of a call to
module classes with ``torch.profiler``, ``rows`` measures the rows of one condition, and
``stage`` measures the runtime and breakdown tables of one device and merges devices. The
timing itself is the measure stage's (:mod:`hwgptbench.meters.latency`). ``workloads``,
``breakdown``, ``rows``, ``serving`` and ``parallel`` need torch and numpy only (the tables
are written by ``stage`` and ``parallel``'s entry point, with polars), so they run on
measurement machines with few packages.
"""
