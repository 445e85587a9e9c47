#!/usr/bin/env bash
# Registers the cluster, the QOS, accounts and users in slurmdbd (idempotent; start.sh runs it
# once slurmdbd answers, before slurmctld starts). Needs a running slurmdbd.
#
#   infra/slurm/accounts.sh [STATE_DIR]
#
#   ALLMENDE_SLURM_ACCOUNTS_LIST  accounts to create under root      (default: allmende)
#   ALLMENDE_SLURM_USERS          users added to every account above  (default: root)
#
# QOS: normal (default), preemptible, high, ordered by their priority (100000, 10000, 0 with
# slurm.conf's PriorityWeightQOS). None preempts another: Slurm's preemption is off
# (PreemptType=preempt/none) and the Allmende agent stops the victims the API names.
# Every user gets all three, default normal, default account the first account.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

ACCOUNTS=${ALLMENDE_SLURM_ACCOUNTS_LIST:-allmende}
USERS=${ALLMENDE_SLURM_USERS:-root}

# timeout: a hung sacctmgr must not hang start.sh
sam() { timeout 60 /usr/bin/sacctmgr -i "$@"; }
exists() { # exists ENTITY FIELD NAME: ENTITY is qos or cluster
  timeout 60 /usr/bin/sacctmgr -n -P show "$1" format="$2" | grep -xF "$3" >/dev/null
}

if ! exists cluster cluster "$CLUSTER_NAME"; then
  sam add cluster "$CLUSTER_NAME" >/dev/null
  echo "accounts.sh: cluster $CLUSTER_NAME added"
fi

for q in normal preemptible high; do
  exists qos name "$q" || sam add qos "$q" >/dev/null
done
# Preempt= (empty) clears a list an earlier version of this script set
sam modify qos preemptible set PreemptMode=requeue Priority=0 >/dev/null || true
sam modify qos normal set Preempt= Priority=10000 >/dev/null || true
sam modify qos high set Preempt= Priority=100000 >/dev/null || true

first_account=""
for a in ${ACCOUNTS//,/ }; do
  first_account=${first_account:-$a}
  if ! timeout 60 /usr/bin/sacctmgr -n -P show assoc cluster="$CLUSTER_NAME" account="$a" format=account |
    grep -xF "$a" >/dev/null; then
    sam add account "$a" cluster="$CLUSTER_NAME" description="$a" organization=allmende >/dev/null
  fi
done

for u in ${USERS//,/ }; do
  for a in ${ACCOUNTS//,/ }; do
    if ! timeout 60 /usr/bin/sacctmgr -n -P show assoc cluster="$CLUSTER_NAME" account="$a" user="$u" \
      format=user | grep -xF "$u" >/dev/null; then
      sam add user "$u" account="$a" cluster="$CLUSTER_NAME" >/dev/null
    fi
  done
  sam modify user "$u" set DefaultAccount="$first_account" >/dev/null || true
  sam modify user "$u" set QOS=normal,preemptible,high DefaultQOS=normal >/dev/null || true
done
echo "accounts.sh: cluster $CLUSTER_NAME, accounts [$ACCOUNTS], users [$USERS], QOS normal/preemptible/high"
