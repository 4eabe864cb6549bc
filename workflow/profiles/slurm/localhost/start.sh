#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (munged, slurmctld, slurmd; no accounting) to
# try workflow/profiles/slurm without a cluster (docs/cluster.md). Needs root and Debian's
#   apt-get install -y slurm-wlm munge
# Config, state and logs go to $HWGPT_SLURM_DIR (default /tmp/hwgptbench-slurm); munged uses
# the key the munge package made (/etc/munge/munge.key), or is left alone when already running.
# SLURM's commands find the cluster without settings (slurmd's /run/slurm/conf). Waits until
# the node is idle. Stop it with stop.sh (same HWGPT_SLURM_DIR).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${HWGPT_SLURM_DIR:-/tmp/hwgptbench-slurm}
conf=$dir/slurm.conf

fail() {
  echo "start.sh: $*" >&2
  "$here/stop.sh"
  exit 1
}

refuse() {
  echo "start.sh: $*" >&2
  exit 1
}

[[ $EUID -eq 0 ]] || refuse "run as root (slurmd starts jobs as the users who submit them)"
for tool in munge munged slurmctld slurmd sinfo sbatch squeue; do
  command -v "$tool" >/dev/null || refuse "no $tool: apt-get install -y slurm-wlm munge"
done
[[ ! -e /etc/slurm/slurm.conf ]] || refuse "this machine has /etc/slurm/slurm.conf: a cluster's"
if [[ -f $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
  echo "start.sh: already running ($dir)" >&2
  exit 0
fi
mkdir -p "$dir/state" "$dir/spool"

if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  # as the munge package's service would: as user munge, socket in /run/munge
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- munged --pid-file /run/munge/munged.pid \
    || refuse "munged did not start (key /etc/munge/munge.key, log /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$dir/munged.pid"  # stop.sh stops only a munged started here
fi

# the node as slurmd sees this machine: CPUs=... RealMemory=...
hardware=$(slurmd -C | head -1)
cpus=$(sed -E 's/.*\bCPUs=([0-9]+).*/\1/' <<<"$hardware")
memory=$(sed -E 's/.*\bRealMemory=([0-9]+).*/\1/' <<<"$hardware")
sed -e "s|@DIR@|$dir|g" -e "s|@CPUS@|$cpus|g" -e "s|@MEMORY_MB@|$memory|g" \
  "$here/slurm.conf.in" >"$conf"

# -c: an empty queue, whatever an earlier run left in the state
slurmctld -f "$conf" -c || fail "slurmctld did not start (see $dir/slurmctld.log)"
slurmd --conf-server 127.0.0.1 -N localhost || fail "slurmd did not start (see $dir/slurmd.log)"

for _ in $(seq 60); do
  if [[ $(sinfo -h -n localhost -o %T 2>/dev/null) == idle ]]; then
    echo "start.sh: node localhost idle ($cpus CPUs, $memory MB), partition local, in $dir" >&2
    exit 0
  fi
  sleep 1
done
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
fail "the node did not become idle within 60 s (logs above)"
