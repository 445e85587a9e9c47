#!/bin/sh
# Example PrologSlurmctld / EpilogSlurmctld (NOT the Allmende hook): writes the environment the
# hook sees to $ALLMENDE_SLURM_DIR/hooks/<job id>.<prolog|epilog>.<pid>.env (/tmp without
# infra/slurm/start.sh's wrapper, which sets ALLMENDE_SLURM_DIR, SLURM_CONF and PATH).
# slurmctld runs it as SlurmUser, cwd = slurmctld's cwd, no arguments; a non-zero exit of the
# prolog requeues/holds the job (see slurm.conf(5) PrologSlurmctld), so always exit 0 here.
out=${ALLMENDE_SLURM_DIR:-/tmp}/hooks
[ "${ALLMENDE_SLURM_DIR:-}" ] || out=/tmp
mkdir -p "$out"
case "${SLURM_SCRIPT_CONTEXT:-}" in
  prolog*) kind=prolog ;;
  epilog*) kind=epilog ;;
  *) kind=unknown ;;
esac
{
  echo "# $(date -Is) uid=$(id -u) user=$(id -un) cwd=$(pwd) args=$*"
  env | sort
  # what the environment lacks (GPUs, QOS, TRES, times) is one scontrol away; works from
  # inside the hook (slurmctld does not hold its job lock while the script runs)
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "# scontrol show job -d -o $SLURM_JOB_ID"
    timeout 10 scontrol show job -d -o "$SLURM_JOB_ID" 2>&1
  fi
} >"$out/${SLURM_JOB_ID:-nojob}.$kind.$$.env"
exit 0
