#!/bin/sh
# Slurm node Prolog and Epilog (slurm.conf: Prolog=/Epilog= this script, PrologFlags=Alloc so the
# prolog runs when the job is allocated): tell NVIDIA's dcgm-exporter which of this node's GPUs a
# job holds. The exporter, started with --hpc-job-mapping-dir DIR, reads one file per GPU index in
# DIR, holding the ids of the jobs on that GPU one per line, and labels that GPU's metrics with
# hpc_job="<id>"; Allmende's collector (`allmende collect dcgm`) reads the labels. Slurm gives the
# job's GPU indices on this node in SLURM_JOB_GPUS.
#
# It never fails the job: a prolog that fails drains the node, and a job without its mapping is
# still charged from Slurm's lifecycle (only its utilisation goes unseen). Problems go to stderr
# (slurmd's log). DIR: $ALLMENDE_DCGM_MAPPING_DIR, default /run/dcgm-job-mapping.
#
# The id written is the one the platform knows the job by (ALLMENDE_DCGM_JOB_LABEL=platform, the
# default), so its samples meet its lifecycle events: the admission id job_submit.lua stored as
# `allmende:<id>` in the job's admin comment (ALLMENDE_SLURM_ID_FIELD=comment: its comment), else
# slurm-<ClusterName>-<job id>, as integrations/slurm/lifecycle.py names it. Asked of slurmctld
# once, in the prolog (`scontrol show job`), and kept in DIR/.jobs/<job id> for the epilog.
# ALLMENDE_DCGM_JOB_LABEL=slurm writes Slurm's job id, as the exporter's own docs do.

[ -n "${PATH:-}" ] || PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin # slurmd gives none
export PATH
dir=${ALLMENDE_DCGM_MAPPING_DIR:-/run/dcgm-job-mapping}
job=${SLURM_JOB_ID:-}
gpus=${SLURM_JOB_GPUS:-}
case ${SLURM_SCRIPT_CONTEXT:-} in
  prolog_slurmd) adding=1 ;;
  epilog_slurmd) adding=0 ;;
  *)
    echo "dcgm_job_mapping.sh: not run as a node Prolog or Epilog (SLURM_SCRIPT_CONTEXT=${SLURM_SCRIPT_CONTEXT:-})" >&2
    exit 0
    ;;
esac
[ -n "$job" ] && [ -n "$gpus" ] || exit 0 # no GPUs on this node: nothing to map

if ! mkdir -p "$dir" || ! exec 9>"$dir/.lock"; then
  echo "dcgm_job_mapping.sh: cannot write in $dir" >&2
  exit 0
fi
flock -w 10 9 || echo "dcgm_job_mapping.sh: $dir/.lock busy for 10 s; going on" >&2

slurm_id=$job
mkdir -p "$dir/.jobs" 2>/dev/null
if [ "${ALLMENDE_DCGM_JOB_LABEL:-platform}" = slurm ]; then
  :
elif [ $adding = 1 ]; then
  field=AdminComment
  [ "${ALLMENDE_SLURM_ID_FIELD:-admin_comment}" = comment ] && field=Comment
  found=$(scontrol show job -o "$slurm_id" 2>/dev/null |
    sed -n "s|.* $field=allmende:\([A-Za-z0-9._:@/+-]*\).*|\1|p" | head -n 1)
  job=${found:-slurm-${SLURM_CLUSTER_NAME:-cluster}-$slurm_id}
  printf '%s\n' "$job" >"$dir/.jobs/$slurm_id" || echo "dcgm_job_mapping.sh: cannot write $dir/.jobs/$slurm_id" >&2
else
  job=$(cat "$dir/.jobs/$slurm_id" 2>/dev/null || echo "slurm-${SLURM_CLUSTER_NAME:-cluster}-$slurm_id")
  rm -f "$dir/.jobs/$slurm_id"
fi

for gpu in $(echo "$gpus" | tr ',' ' '); do
  case $gpu in *[!0-9]*) echo "dcgm_job_mapping.sh: GPU index '$gpu' in SLURM_JOB_GPUS=$gpus" >&2; continue ;; esac
  file="$dir/$gpu"
  # The other jobs on this GPU stay (GPUs may be shared); this job is added or taken out.
  others=$(grep -vx -- "$job" "$file" 2>/dev/null)
  [ $adding = 1 ] && others=$(printf '%s\n%s\n' "$others" "$job" | sed '/^$/d')
  if [ -n "$others" ]; then
    # Written aside and renamed: the exporter never reads half a file.
    printf '%s\n' "$others" >"$file.$slurm_id.tmp" && mv -f "$file.$slurm_id.tmp" "$file" ||
      echo "dcgm_job_mapping.sh: cannot write $file" >&2
  else
    rm -f "$file"
  fi
done
exit 0
