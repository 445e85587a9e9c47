#!/usr/bin/env bash
# Starts a self-contained Slurm 22.05 cluster on localhost: munged, MariaDB, slurmdbd,
# slurmctld and one slurmd with fake GPUs. Everything lives under one state directory:
#
#   infra/slurm/start.sh [STATE_DIR]      # default: $ALLMENDE_SLURM_DIR or <repo>/.allmende/slurm
#   export SLURM_CONF=STATE_DIR/etc/slurm.conf   # then sbatch, squeue, sacct, sacctmgr, scontrol
#
# Re-running is safe: daemons already running (by their pid files) are left alone; configs
# are rewritten each time (apply changes with stop.sh + start.sh, or `scontrol reconfigure`).
# See README.md for the settings (ALLMENDE_SLURM_* environment variables).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

TIMEOUT=${ALLMENDE_SLURM_START_TIMEOUT:-90}
PARTITIONS=${ALLMENDE_SLURM_PARTITIONS:-ef-cluster01}
GPU_TYPE=${ALLMENDE_SLURM_GPU_TYPE:-h100}
GPU_COUNT=${ALLMENDE_SLURM_GPUS:-8}
NODE_CPUS=${ALLMENDE_SLURM_CPUS:-64}
NODE_MEMORY=${ALLMENDE_SLURM_MEMORY_MB:-512000}
JOB_SUBMIT_LUA=${ALLMENDE_SLURM_JOB_SUBMIT_LUA-$REPO_ROOT/integrations/slurm/job_submit.example.lua}
# cli_filter.lua (empty: none): runs in sbatch/salloc/srun, before slurmctld is contacted
CLI_FILTER_LUA=${ALLMENDE_SLURM_CLI_FILTER_LUA:-}
# shellcheck disable=SC2034 # read via ${!var}
PROLOG_SLURMCTLD=${ALLMENDE_SLURM_PROLOG_SLURMCTLD:-}
# shellcheck disable=SC2034
EPILOG_SLURMCTLD=${ALLMENDE_SLURM_EPILOG_SLURMCTLD:-}
# The node's Prolog/Epilog (slurmd; empty: none), e.g. integrations/slurm/hooks/dcgm_job_mapping.sh,
# run with ALLMENDE_DCGM_MAPPING_DIR (default <state>/dcgm-jobs: the exporter's mapping directory)
# shellcheck disable=SC2034
PROLOG_SLURMD=${ALLMENDE_SLURM_PROLOG:-}
# shellcheck disable=SC2034
EPILOG_SLURMD=${ALLMENDE_SLURM_EPILOG:-}
DEBUG_LEVEL=${ALLMENDE_SLURM_DEBUG:-info}
CRED_EXPIRE=${ALLMENDE_SLURM_CRED_EXPIRE:-15}
PROCTRACK=${ALLMENDE_SLURM_PROCTRACK:-proctrack/linuxproc}
TASK_PLUGIN=${ALLMENDE_SLURM_TASK_PLUGIN:-task/none}
SCHED_PARAMS=${ALLMENDE_SLURM_SCHEDULER_PARAMETERS:-bf_interval=2,sched_interval=5}

started_at=$SECONDS
say() { echo "start.sh: $*"; }

logs_of() {
  case $1 in
    munged) echo "$LOG_DIR/munged.out" ;; # in the foreground munged logs to stderr
    mariadbd) echo "$LOG_DIR/mariadbd.log $LOG_DIR/mariadbd.out $LOG_DIR/mariadb-install-db.log" ;;
    *) echo "$LOG_DIR/$1.log $LOG_DIR/$1.out" ;;
  esac
}

fail() {
  local name=$1
  shift
  echo "start.sh: ERROR: $*" >&2
  local f
  for f in $(logs_of "$name"); do
    if [[ -s $f ]]; then
      echo "----- last lines of $f -----" >&2
      tail -n 30 "$f" >&2
    fi
  done
  echo "start.sh: the daemons already started are still running; stop them with" >&2
  echo "          $SLURM_SCRIPTS_DIR/stop.sh $STATE_DIR" >&2
  exit 1
}

show_probe() {
  if [[ -s $1 ]]; then
    echo "----- last output of: $2 -----" >&2
    tail -n 15 "$1" >&2
  fi
}

# wait_for NAME DESCRIPTION COMMAND...: polls COMMAND until it succeeds; fails with the log
# tail when the daemon NAME dies or the timeout passes.
wait_for() {
  local name=$1 what=$2
  shift 2
  local deadline=$((SECONDS + TIMEOUT)) probe=$RUN_DIR/probe.out
  until "$@" >"$probe" 2>&1; do
    if [[ -z $(daemon_pid "$name") ]]; then
      show_probe "$probe" "$*"
      fail "$name" "$name exited while waiting for $what"
    fi
    if ((SECONDS >= deadline)); then
      show_probe "$probe" "$*"
      fail "$name" "timed out after ${TIMEOUT}s waiting for $what"
    fi
    sleep 0.3
  done
  rm -f "$probe"
}

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# launch NAME COMMAND...: starts COMMAND (a daemon kept in the foreground) in its own session,
# its output in log/NAME.out, its pid in run/NAME.pid.
launch() {
  local name=$1
  shift
  # cwd: the state dir, so no daemon (nor a hook script it runs) holds the caller's directory
  (cd "$STATE_DIR" && exec setsid "$@" </dev/null >>"$LOG_DIR/$name.out" 2>&1) &
  echo $! >"$(pid_file "$name")"
}

die() {
  echo "start.sh: ERROR: $*" >&2
  exit 1
}

# Before starting anything: every daemon not running yet needs its port free.
check_ports() {
  local name port var
  while read -r name port var; do
    [[ -n $(daemon_pid "$name") ]] && continue
    port_free "$port" || die "port $port for $name is taken (another instance?); set $var"
  done <<PORTS
mariadbd $MYSQL_PORT ALLMENDE_SLURM_MYSQL_PORT
slurmdbd $DBD_PORT ALLMENDE_SLURM_DBD_PORT
slurmctld $CTLD_PORT ALLMENDE_SLURM_CTLD_PORT
slurmd $SLURMD_PORT ALLMENDE_SLURM_SLURMD_PORT
PORTS
}

check_installed() {
  local b
  for b in /usr/sbin/munged /usr/sbin/mariadbd /usr/sbin/slurmdbd /usr/sbin/slurmctld \
    /usr/sbin/slurmd /usr/bin/sacctmgr /usr/bin/mariadb-install-db; do
    [[ -x $b ]] || {
      echo "start.sh: $b missing; run $SLURM_SCRIPTS_DIR/install.sh" >&2
      exit 1
    }
  done
  [[ $(id -u) -eq 0 ]] || {
    echo "start.sh: must run as root (slurmd and munged need it)" >&2
    exit 1
  }
}

check_socket_path() {
  # sun_path holds 107 characters
  if ((${#1} > 100)); then
    echo "start.sh: socket path too long for a unix socket (${#1} > 100): $1" >&2
    echo "          choose a shorter state directory" >&2
    exit 1
  fi
}

# ---------------------------------------------------------------------------------------
# configuration files

# Allmende's plugins load their shared module (allmende_slurm.lua) from their own directory:
# copied next to them when the plugin's source directory has one.
copy_lua_module() {
  local module
  [[ -n $1 && $1 != none ]] || return 0
  module=$(dirname "$1")/allmende_slurm.lua
  if [[ -r $module ]] && ! cmp -s "$module" "$ETC_DIR/allmende_slurm.lua"; then
    cp "$module" "$ETC_DIR/allmende_slurm.lua"
    chmod 644 "$ETC_DIR/allmende_slurm.lua"
  fi
}

write_configs() {
  mkdir -p "$ETC_DIR" "$LOG_DIR" "$RUN_DIR" "$GPU_DIR" "$SPOOL_CTLD" "$SPOOL_D" "$STATE_DIR/hooks"
  chmod 755 "$STATE_DIR" "$ETC_DIR"

  # Fake GPUs: character devices with /dev/null's numbers (1:3) when mknod is allowed, plain
  # files otherwise. Slurm 22.05 drops GRES files that are not devices from the job's device
  # list ("... is not a valid character or block device"): then CUDA_VISIBLE_DEVICES and
  # SLURM_JOB_GPUS stay unset, although the counts and accounting still work.
  local i f
  for ((i = 0; i < GPU_COUNT; i++)); do
    f=$GPU_DIR/gpu$i
    [[ -c $f ]] && continue
    rm -f "$f"
    mknod -m 666 "$f" c 1 3 2>/dev/null || : >"$f"
  done

  local db_pass_file=$MYSQL_DIR/slurm.pass
  if [[ ! -s $db_pass_file ]]; then
    mkdir -p "$MYSQL_DIR"
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$db_pass_file")
  fi
  DB_PASS=$(cat "$db_pass_file")

  local job_submit_line=""
  if [[ -n $JOB_SUBMIT_LUA && $JOB_SUBMIT_LUA != none ]]; then
    [[ -r $JOB_SUBMIT_LUA ]] || die "ALLMENDE_SLURM_JOB_SUBMIT_LUA: cannot read $JOB_SUBMIT_LUA"
    # slurmctld reads job_submit.lua from the directory of slurm.conf and reloads it when its
    # mtime is newer than the last load (whole seconds). Copied only when the content differs,
    # so a re-run of start.sh does not make slurmctld reload for nothing.
    if ! cmp -s "$JOB_SUBMIT_LUA" "$ETC_DIR/job_submit.lua"; then
      cp "$JOB_SUBMIT_LUA" "$ETC_DIR/job_submit.lua"
    fi
    job_submit_line="JobSubmitPlugins=lua"
  fi
  copy_lua_module "$JOB_SUBMIT_LUA"

  # cli_filter.lua is read by the clients, from the directory of slurm.conf too
  local cli_filter_line=""
  rm -f "$ETC_DIR/cli_filter.lua"
  if [[ -n $CLI_FILTER_LUA && $CLI_FILTER_LUA != none ]]; then
    [[ -r $CLI_FILTER_LUA ]] || die "ALLMENDE_SLURM_CLI_FILTER_LUA: cannot read $CLI_FILTER_LUA"
    cp "$CLI_FILTER_LUA" "$ETC_DIR/cli_filter.lua"
    chmod 644 "$ETC_DIR/cli_filter.lua"
    cli_filter_line="CliFilterPlugins=lua"
    copy_lua_module "$CLI_FILTER_LUA"
  fi

  # slurmctld runs PrologSlurmctld/EpilogSlurmctld with only SLURM_* job variables: no PATH,
  # no SLURM_CONF. A generated wrapper adds those (and ALLMENDE_SLURM_DIR), then execs the hook.
  local hook_lines="" kind script var
  for kind in prolog epilog; do
    var=${kind^^}_SLURMCTLD
    script=${!var}
    rm -f "$ETC_DIR/${kind}_slurmctld.sh"
    [[ -n $script ]] || continue
    [[ -x $script ]] || die "ALLMENDE_SLURM_${var}: $script is not executable"
    cat >"$ETC_DIR/${kind}_slurmctld.sh" <<HOOK
#!/bin/sh
# Generated by infra/slurm/start.sh: environment for the ${kind} hook, then the hook.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SLURM_CONF='$SLURM_CONF_FILE'
ALLMENDE_SLURM_DIR='$STATE_DIR'
export PATH SLURM_CONF ALLMENDE_SLURM_DIR
exec '$(realpath "$script")' "\$@"
HOOK
    chmod 755 "$ETC_DIR/${kind}_slurmctld.sh"
    hook_lines+="${kind^}Slurmctld=$ETC_DIR/${kind}_slurmctld.sh"$'\n'
  done
  # The node's hooks run under slurmd, with its environment; the wrapper adds the mapping directory.
  local mapping_dir=${ALLMENDE_DCGM_MAPPING_DIR:-$STATE_DIR/dcgm-jobs}
  for kind in prolog epilog; do
    var=${kind^^}_SLURMD
    script=${!var}
    rm -f "$ETC_DIR/${kind}_slurmd.sh"
    [[ -n $script ]] || continue
    [[ -x $script ]] || die "ALLMENDE_SLURM_${kind^^}: $script is not executable"
    cat >"$ETC_DIR/${kind}_slurmd.sh" <<HOOK
#!/bin/sh
# Generated by infra/slurm/start.sh: environment for the node's ${kind}, then the hook.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ALLMENDE_DCGM_MAPPING_DIR='$mapping_dir'
export PATH ALLMENDE_DCGM_MAPPING_DIR
exec '$(realpath "$script")' "\$@"
HOOK
    chmod 755 "$ETC_DIR/${kind}_slurmd.sh"
    hook_lines+="${kind^}=$ETC_DIR/${kind}_slurmd.sh"$'\n'
  done
  # the node's prolog at allocation (not at the first step): the mapping is there before the job runs
  [[ -n $PROLOG_SLURMD ]] && hook_lines+="PrologFlags=Alloc"$'\n'

  local partition_lines="" first=1 p
  for p in ${PARTITIONS//,/ }; do
    if ((first)); then
      partition_lines+="PartitionName=$p Nodes=$NODE_NAME Default=YES MaxTime=INFINITE State=UP"$'\n'
      first=0
    else
      partition_lines+="PartitionName=$p Nodes=$NODE_NAME MaxTime=INFINITE State=UP"$'\n'
    fi
  done

  local gpu_files="$GPU_DIR/gpu[0-$((GPU_COUNT - 1))]"
  ((GPU_COUNT == 1)) && gpu_files="$GPU_DIR/gpu0"

  : >"$ETC_DIR/plugstack.conf"

  cat >"$SLURM_CONF_FILE" <<CONF
# Generated by infra/slurm/start.sh; rewritten on every start.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE_NAME(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root

AuthType=auth/munge
# cred_expire also delays a requeued job's next start (default 120 s)
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE
CredType=cred/munge

StateSaveLocation=$SPOOL_CTLD
SlurmdSpoolDir=$SPOOL_D
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=$DEBUG_LEVEL
SlurmdDebug=$DEBUG_LEVEL
PlugStackConfig=$ETC_DIR/plugstack.conf
MailProg=/bin/true

ProctrackType=$PROCTRACK
TaskPlugin=$TASK_PLUGIN
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
MpiDefault=none
SwitchType=switch/none

SchedulerType=sched/backfill
# backfill every 2 s (default 30): a job waiting on a preempted job's GPUs starts promptly
SchedulerParameters=$SCHED_PARAMS
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# the node's CPUs and memory are declared, not detected
SlurmdParameters=config_overrides
ReturnToService=2

AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# the munge socket for talking to slurmdbd: without it clients and slurmctld use the default
# /run/munge/munge.socket.2 for slurmdbd connections, whatever AuthInfo says
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE
AccountingStorageEnforce=associations,limits,qos
JobCompType=jobcomp/none

# The platform orders the pending queue: its fair share reaches Slurm as each pending job's Nice
# (the agent), so Slurm's own fair-share weight is 0; the QOS (priority class) comes first.
PriorityType=priority/multifactor
PriorityWeightFairshare=0
PriorityWeightAge=0
PriorityWeightJobSize=0
PriorityWeightPartition=0
PriorityWeightQOS=1000000
# Slurm never preempts on its own: the agent stops the victims the admission API names, so the
# lanes alone decide who may be preempted (docs/slurm.md).
PreemptType=preempt/none
PreemptMode=OFF
JobRequeue=1

# quick turnaround for tests
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=60
SlurmdTimeout=60
MessageTimeout=10

$job_submit_line
$cli_filter_line
$hook_lines
NodeName=$NODE_NAME NodeHostname=$NODE_NAME NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY Gres=gpu:$GPU_TYPE:$GPU_COUNT State=UNKNOWN
$partition_lines
CONF

  # read only by the cgroup plugins (proctrack/cgroup, task/cgroup), next to slurm.conf
  cat >"$ETC_DIR/cgroup.conf" <<CONF
# Generated by infra/slurm/start.sh
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
CONF

  cat >"$ETC_DIR/gres.conf" <<CONF
# Generated by infra/slurm/start.sh: fake GPUs (device nodes 1:3 or plain files) under gpus/.
AutoDetect=off
NodeName=$NODE_NAME Name=gpu Type=$GPU_TYPE File=$gpu_files
CONF

  (
    umask 077
    cat >"$ETC_DIR/slurmdbd.conf" <<CONF
# Generated by infra/slurm/start.sh; slurmdbd finds it next to \$SLURM_CONF.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$(pid_file slurmdbd)
LogFile=$LOG_DIR/slurmdbd.log
DebugLevel=$DEBUG_LEVEL
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
CONF
  )
  chmod 600 "$ETC_DIR/slurmdbd.conf"

  cat >"$STATE_DIR/env.sh" <<CONF
# source this file to use the clients: . $STATE_DIR/env.sh
export SLURM_CONF=$SLURM_CONF_FILE
CONF
}

# ---------------------------------------------------------------------------------------
# daemons

start_munged() {
  if [[ -n $(daemon_pid munged) ]]; then
    say "munged already running"
    return
  fi
  mkdir -p "$MUNGE_DIR"
  chmod 755 "$MUNGE_DIR" # clients of any user reach the socket; munged refuses group/other-writable
  if [[ ! -s $MUNGE_DIR/munge.key ]]; then
    /usr/sbin/mungekey --create --keyfile="$MUNGE_DIR/munge.key" --bits=1024
  fi
  chmod 600 "$MUNGE_DIR/munge.key"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  launch munged /usr/sbin/munged --foreground --force \
    --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$(pid_file munged)" \
    --seed-file="$MUNGE_DIR/munged.seed"
  # shellcheck disable=SC2016
  wait_for munged "the munge socket" bash -c \
    'munge -n -S "$1" | unmunge -S "$1"' _ "$MUNGE_SOCKET"
  say "munged up"
}

# shellcheck disable=SC2120
mysql_root() {
  /usr/bin/mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root "$@"
}

start_mariadbd() {
  if [[ -n $(daemon_pid mariadbd) ]]; then
    say "mariadbd already running"
  else
    mkdir -p "$MYSQL_DIR"
    if [[ ! -d $MYSQL_DIR/data/mysql ]]; then
      say "initialising the MariaDB datadir"
      rm -rf "$MYSQL_DIR/data"
      /usr/bin/mariadb-install-db --no-defaults --datadir="$MYSQL_DIR/data" --user=root \
        --auth-root-authentication-method=socket --skip-test-db \
        >"$LOG_DIR/mariadb-install-db.log" 2>&1 ||
        fail mariadbd "mariadb-install-db failed"
    fi
    rm -f "$MYSQL_SOCKET"
    launch mariadbd /usr/sbin/mariadbd --no-defaults --user=root \
      --datadir="$MYSQL_DIR/data" --socket="$MYSQL_SOCKET" \
      --port="$MYSQL_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
      --pid-file="$(pid_file mariadbd)" --log-error="$LOG_DIR/mariadbd.log" \
      --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
      --innodb-lock-wait-timeout=900 --performance-schema=OFF --max-connections=100
    wait_for mariadbd "MariaDB" /usr/bin/mariadb-admin --no-defaults \
      --socket="$MYSQL_SOCKET" -u root ping
    say "mariadbd up"
  fi
  # shellcheck disable=SC2119
  mysql_root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
SQL
}

start_slurmdbd() {
  if [[ -n $(daemon_pid slurmdbd) ]]; then
    say "slurmdbd already running"
  else
    # slurmdbd has no -f: it reads slurmdbd.conf from the directory of $SLURM_CONF
    launch slurmdbd /usr/sbin/slurmdbd -D
  fi
  wait_for slurmdbd "slurmdbd (sacctmgr show cluster)" /usr/bin/sacctmgr -n show cluster
  say "slurmdbd up"
}

start_slurmctld() {
  if [[ -n $(daemon_pid slurmctld) ]]; then
    say "slurmctld already running"
  else
    launch slurmctld /usr/sbin/slurmctld -D -f "$SLURM_CONF_FILE"
  fi
  wait_for slurmctld "slurmctld (scontrol ping)" bash -c \
    '/usr/bin/scontrol ping | grep "is UP" >/dev/null'
  say "slurmctld up"
}

node_ready() {
  local state
  state=$(/usr/bin/sinfo -h -N -n "$NODE_NAME" -o %T 2>/dev/null | head -n1)
  case $state in
    idle | mixed | allocated | completing | drained | draining) return 0 ;;
    *) return 1 ;;
  esac
}

start_slurmd() {
  if [[ -n $(daemon_pid slurmd) ]]; then
    say "slurmd already running"
  else
    launch slurmd /usr/sbin/slurmd -D -f "$SLURM_CONF_FILE" -N "$NODE_NAME"
  fi
  wait_for slurmd "node $NODE_NAME to register (sinfo)" node_ready
  local state
  state=$(/usr/bin/sinfo -h -N -n "$NODE_NAME" -o %T | head -n1)
  if [[ $state == idle ]]; then
    say "slurmd up, node $NODE_NAME idle"
  else
    say "slurmd up, node $NODE_NAME is $state (state kept from an earlier run)"
  fi
}

check_installed
check_socket_path "$MUNGE_SOCKET"
check_socket_path "$MYSQL_SOCKET"
check_ports
write_configs
start_munged
start_mariadbd
start_slurmdbd
if [[ ${ALLMENDE_SLURM_ACCOUNTS:-1} != 0 ]]; then
  "$SLURM_SCRIPTS_DIR/accounts.sh" "$STATE_DIR"
fi
start_slurmctld
start_slurmd
say "ready in $((SECONDS - started_at))s; use: export SLURM_CONF=$SLURM_CONF_FILE"
