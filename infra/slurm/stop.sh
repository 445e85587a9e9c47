#!/usr/bin/env bash
# Stops what start.sh started in STATE_DIR (by pid files), in reverse order: running jobs (the
# node is set DOWN first, so slurmctld requeues or fails them), the job steps (slurmstepd
# processes of this instance and their children), slurmd, slurmctld, slurmdbd, MariaDB, munged.
# Safe to run twice or when nothing runs. State (queue, accounting) is kept for the next start.
#
#   infra/slurm/stop.sh [STATE_DIR]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

GRACE=${ALLMENDE_SLURM_STOP_TIMEOUT:-30}

descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$p"
    descendants "$p"
  done
}

# slurmstepd (one per job step) detaches from slurmd; ours carry SLURM_CONF=<our slurm.conf>
# in their environment, inherited from slurmd.
our_steps() {
  local p
  for p in $(pgrep -x slurmstepd || true); do
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -xF "SLURM_CONF=$SLURM_CONF_FILE" >/dev/null; then
      echo "$p"
    fi
  done
}

stop_steps() {
  local pids=() p c
  for p in $(our_steps); do
    pids+=("$p")
    while read -r c; do [[ -n $c ]] && pids+=("$c"); done < <(descendants "$p")
  done
  ((${#pids[@]})) || return 0
  echo "stop.sh: killing ${#pids[@]} job step process(es)"
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

alive() { # a zombie (not yet reaped by init) counts as gone
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)
  [[ -n $state && $state != Z ]]
}

stop_daemon() {
  local name=$1 pid i
  pid=$(daemon_pid "$name")
  if [[ -z $pid ]]; then
    rm -f "$(pid_file "$name")"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < GRACE * 10; i++)); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    echo "stop.sh: $name ($pid) ignored SIGTERM for ${GRACE}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$(pid_file "$name")"
  echo "stop.sh: $name stopped"
}

# Jobs running on the node would survive in slurmctld's state as ghosts (RUNNING forever, GPUs
# held) once their steps are killed: a restarted slurmd does not report them and slurmctld does
# not notice. Setting the node DOWN first makes slurmctld end them now: batch jobs are requeued
# (JobRequeue=1), others fail with NODE_FAIL. start.sh's slurmd brings the node back
# (ReturnToService=2).
down_node() {
  [[ -n $(daemon_pid slurmctld) ]] || return 0
  local jobs i
  jobs=$(timeout 10 /usr/bin/squeue -h -w "$NODE_NAME" -t running,configuring,completing,suspended \
    -o %i 2>/dev/null | wc -l) || return 0
  ((jobs > 0)) || return 0
  echo "stop.sh: $jobs job(s) on $NODE_NAME; setting it DOWN so slurmctld requeues or fails them"
  timeout 10 /usr/bin/scontrol update nodename="$NODE_NAME" state=down reason="stop.sh" || return 0
  for ((i = 0; i < 150; i++)); do # KillWait is 5 s
    [[ -z $(our_steps) ]] && break
    sleep 0.1
  done
}

down_node
stop_steps
for ((k = ${#DAEMONS[@]} - 1; k >= 0; k--)); do
  stop_daemon "${DAEMONS[k]}"
done
