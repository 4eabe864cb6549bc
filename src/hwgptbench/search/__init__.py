"""The search stage: multi-objective NAS runs against the surrogate benchmark, per
(objectives, device, algorithm), and the final front that bounds them (``front``;
``commands`` holds the subcommands). The algorithms, problems, reference fronts and hypervolume
are the foundation :mod:`hwgptbench.moo`, which is also the Python API for runs of one's own."""
