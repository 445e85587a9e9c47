#!/bin/sh
# Allmende's PrologSlurmctld and EpilogSlurmctld: the same script for both. In slurm.conf:
#   PrologSlurmctld=/path/to/integrations/slurm/hooks/allmende_slurmctld.sh
#   EpilogSlurmctld=/path/to/integrations/slurm/hooks/allmende_slurmctld.sh
# Publishes the job's lifecycle to Kafka through allmende.integrations.slurm.lifecycle, run by
# $ALLMENDE_PYTHON, else a checkout's .venv, else the Python of the environment the allmende wheel
# is installed in (this file is then <venv>/lib/pythonX.Y/site-packages/allmende/integrations/slurm/hooks/). slurmctld runs it as SlurmUser with almost
# no environment (no PATH, no SLURM_CONF): PATH is set here; the config is found through
# $ALLMENDE_SLURM_CONFIG, $SLURM_CONF's directory, else /etc/slurm/allmende.json.
# Always exits 0 (a failing PrologSlurmctld would requeue or hold the job); problems go to the
# hook log (config `log_file`, default <spool_dir>/hooks.log).
#
# By hand: allmende_slurmctld.sh flush   # send the events still in the spool
[ -n "${PATH:-}" ] || PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
here=$(dirname "$(readlink -f "$0")")
checkout=$(cd "$here/../../.." && pwd)
if [ -n "${ALLMENDE_PYTHON:-}" ]; then python=$ALLMENDE_PYTHON
elif [ -x "$checkout/.venv/bin/python" ]; then python=$checkout/.venv/bin/python
else python=$(cd "$here/../../../../../.." && pwd)/bin/python
fi
case "${SLURM_SCRIPT_CONTEXT:-}" in
  prolog_slurmctld) kind=prolog ;;
  epilog_slurmctld) kind=epilog ;;
  *) exec "$python" -m allmende.integrations.slurm.lifecycle "$@" ;; # by hand: prolog|epilog|flush
esac
"$python" -m allmende.integrations.slurm.lifecycle "$kind" </dev/null >/dev/null 2>&1
exit 0
