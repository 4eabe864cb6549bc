"""Measurement campaigns: the archs of a shard measured on this machine under every condition,
in groups that fit a memory budget (planned before any job starts, shrunk when other processes
take memory), stored group by group so that a stopped job resumes, with a share of the archs
timed again in a separate visit. The measure stage and the transfer stage's ``adapt`` both
run them; the per-arch meters they call are :mod:`hwgptbench.meters`."""
