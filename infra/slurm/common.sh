# shellcheck shell=bash disable=SC2034
# Shared settings of start.sh, stop.sh, accounts.sh and env.sh (sourced, not run).
# Every path lives under one state directory: the first argument, else $ALLMENDE_SLURM_DIR,
# else <repo>/.allmende/slurm. Settings are environment variables prefixed ALLMENDE_SLURM_
# (never SLURM_*, which Slurm's own commands read).

SLURM_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SLURM_SCRIPTS_DIR/../.." && pwd)

STATE_DIR=${1:-${ALLMENDE_SLURM_DIR:-$REPO_ROOT/.allmende/slurm}}
mkdir -p "$STATE_DIR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)

ETC_DIR=$STATE_DIR/etc
LOG_DIR=$STATE_DIR/log
RUN_DIR=$STATE_DIR/run
MUNGE_DIR=$STATE_DIR/munge
MYSQL_DIR=$STATE_DIR/mysql
GPU_DIR=$STATE_DIR/gpus
SPOOL_CTLD=$STATE_DIR/spool/slurmctld
SPOOL_D=$STATE_DIR/spool/slurmd

SLURM_CONF_FILE=$ETC_DIR/slurm.conf
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MYSQL_SOCKET=$MYSQL_DIR/mysqld.sock

CLUSTER_NAME=${ALLMENDE_SLURM_CLUSTER:-allmende}
NODE_NAME=${ALLMENDE_SLURM_NODE:-$(hostname -s)}
CTLD_PORT=${ALLMENDE_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${ALLMENDE_SLURM_SLURMD_PORT:-16818}
DBD_PORT=${ALLMENDE_SLURM_DBD_PORT:-16819}
MYSQL_PORT=${ALLMENDE_SLURM_MYSQL_PORT:-16306}

# Daemons in start order; stop.sh goes backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

pid_file() { echo "$RUN_DIR/$1.pid"; }

# The pid of a daemon from its pid file if that process is alive and still runs the expected
# binary (guards against a recycled pid); empty otherwise.
daemon_pid() {
  local name=$1 file pid exe
  file=$(pid_file "$name")
  [[ -s $file ]] || return 0
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  case "$name:$(basename "${exe% (deleted)}")" in
    munged:munged | mariadbd:mariadbd | mariadbd:mysqld | slurmdbd:slurmdbd | \
      slurmctld:slurmctld | slurmctld:slurmctld-wlm | slurmd:slurmd | slurmd:slurmd-wlm) echo "$pid" ;;
  esac
}

export SLURM_CONF=$SLURM_CONF_FILE
