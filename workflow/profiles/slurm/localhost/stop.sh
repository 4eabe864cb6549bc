#!/usr/bin/env bash
# Stop the cluster of start.sh: cancel its jobs, then stop slurmd, slurmctld and a munged
# start.sh started, each by its pid file in $HWGPT_SLURM_DIR (default /tmp/hwgptbench-slurm).
# Config, state and logs stay there.
set -euo pipefail

dir=${HWGPT_SLURM_DIR:-/tmp/hwgptbench-slurm}

# stop PIDFILE PROGRAM: a pid file whose process is gone or another program is only removed
stop() {
  local pidfile=$1 program=$2 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ $(ps -p "$pid" -o comm= 2>/dev/null) == "$program" ]]; then
    kill "$pid"
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: $program ($pid) is still running" >&2
      return 1
    fi
    echo "stop.sh: stopped $program ($pid)" >&2
  fi
  rm -f "$pidfile"
}

# jobs still queued or running are cancelled while slurmd can still end them
if [[ -f $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    scancel $jobs
    for _ in $(seq 100); do
      [[ -z $(squeue -h -o %i -t running,completing 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
fi
stop "$dir/slurmd.pid" slurmd
stop "$dir/slurmctld.pid" slurmctld
stop "$dir/munged.pid" munged
# slurmd's copy of the config, where SLURM's commands would still find it
if [[ $(readlink /run/slurm/conf) == "$dir/spool/conf-cache" ]]; then
  rm /run/slurm/conf
fi
