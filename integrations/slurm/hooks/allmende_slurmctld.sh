#!/bin/sh
# Allmende's PrologSlurmctld and EpilogSlurmctld: the same script for both. In slurm.conf:
#   PrologSlurmctld=/path/to/integrations/slurm/hooks/allmende_slurmctld.sh
#   EpilogSlurmctld=/path/to/integrations/slurm/hooks/allmende_slurmctld.sh
# Publishes the job's lifecycle to Kafka through integrations/slurm/lifecycle.py, run with the
# project's virtualenv (ALLMENDE_PYTHON overrides it). slurmctld runs it as SlurmUser with almost
# no environment (no PATH, no SLURM_CONF): PATH is set here; the config is found through
# $ALLMENDE_SLURM_CONFIG, $SLURM_CONF's directory, else /etc/slurm/allmende.json.
# Always exits 0 (a failing PrologSlurmctld would requeue or hold the job); problems go to the
# hook log (config `log_file`, default <spool_dir>/hooks.log).
#
# By hand: allmende_slurmctld.sh flush   # send the events still in the spool
[ -n "${PATH:-}" ] || PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
here=$(dirname "$(readlink -f "$0")")
root=$(cd "$here/../../.." && pwd)
python=${ALLMENDE_PYTHON:-$root/.venv/bin/python}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root" || exit 0
case "${SLURM_SCRIPT_CONTEXT:-}" in
  prolog_slurmctld) kind=prolog ;;
  epilog_slurmctld) kind=epilog ;;
  *) exec "$python" -m integrations.slurm.lifecycle "$@" ;; # by hand: prolog|epilog|flush
esac
"$python" -m integrations.slurm.lifecycle "$kind" </dev/null >/dev/null 2>&1
exit 0
