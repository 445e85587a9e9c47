#!/usr/bin/env bash
# Installs, from Debian 12's own packages, what a local Slurm 22.05 test cluster needs:
# the Slurm daemons and clients, munge, MariaDB (accounting storage for slurmdbd) and the
# Lua 5.1 modules the job_submit/lua plugin can load (Debian's job_submit_lua.so links
# liblua5.1-0, shipped with slurm-wlm-basic-plugins). Idempotent: runs `apt-get update`
# and `apt-get install` only when a package is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  slurmctld slurmd slurm-client slurmdbd
  slurm-wlm-basic-plugins slurm-wlm-mysql-plugin
  munge
  mariadb-server mariadb-client
  liblua5.1-0 lua5.1 lua-socket lua-cjson lua-luaossl
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install.sh: all Slurm packages present"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  SUDO=(sudo)
fi

echo "install.sh: installing ${missing[*]}"
# Debian's maintainer scripts try to start the daemons (invoke-rc.d); without systemd/init they
# fail or start system-wide instances we do not want. A policy-rc.d that forbids every start
# keeps the install inert; it is removed again afterwards unless it was there before.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
  "${SUDO[@]}" chmod 755 "$policy"
  created_policy=1
fi
cleanup() {
  if ((created_policy)); then "${SUDO[@]}" rm -f "$policy"; fi
}
trap cleanup EXIT

"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install.sh: done"
