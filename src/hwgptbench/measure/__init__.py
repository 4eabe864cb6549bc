"""The measure stage: latency, energy, memory and FLOPs of the sampled archs on the machine
the job runs on, as shard and device tables (``stage``), planned with ``plan``; ``commands``
holds the subcommands. The meters are the foundation :mod:`hwgptbench.meters`. Nothing is
imported here: the command line loads a module when a subcommand runs it."""
