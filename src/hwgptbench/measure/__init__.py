"""The measure stage: latency, energy, memory and FLOPs of fixed models, one row per arch and
condition, on the machine the job runs on.

The library modules (``condition``, ``device``, ``latency``, ``energy``, ``memory``, ``flops``,
``quantize``, ``runner``, ``budget``, ``groups``, ``plan``) need torch and numpy only (pynvml
is imported where NVML is read), so that they run on measurement machines with few packages.
``stage`` turns them into shard and device tables; ``commands`` holds the subcommands. Nothing
is imported here: the command line loads a module when a subcommand runs it.
"""
