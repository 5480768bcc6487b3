#!/bin/bash
# fy-attest: switch tenant-isolation attestation on or off in ONE container of the docker cluster by
# adding/removing a marked block in its FleetYield config files (installed as /usr/local/sbin/fy-attest).
# The cluster-wide switch, with enrolment and the baseline, is ../attest.sh (run on the host).
#   fy-attest node on|off        /etc/fleetyield/agent.toml  [attest] table (controller URL + public key)
#                                /etc/fleetyield/hooks.conf   attest = true (Epilog wipe + hand-over,
#                                                             fail-closed Prolog verdict check)
#                                the agent reads its config at start: `fy-service agent restart` after this
#   fy-attest controller on|off  /etc/fleetyield/fleetyield.toml  [attest] enabled (verify quotes, sign
#                                verdicts, gate and drain); `fy-service controller restart` after this
#   fy-attest status             "on" (exit 0) or "off" (exit 3) for this container's files
# Files it refers to (made by attest.sh): the controller's verdict key, policy and database under
# /var/lib/fleetyield/attest (fleetyield-state volume, never seen by the nodes), the public key
# /etc/fleetyield-secret/fy-attest.pub (shared secret volume, read by agents and the Prolog).
set -euo pipefail
BEGIN="# --- fy-attest begin (docker/fy-attest.sh) ---"
END="# --- fy-attest end ---"
PUB=/etc/fleetyield-secret/fy-attest.pub
ATTEST_DIR=/var/lib/fleetyield/attest

usage() { echo "usage: fy-attest node|controller on|off | fy-attest status" >&2; exit 2; }

strip() { # file: remove our block (idempotent)
  [[ -f $1 ]] || return 0
  sed -i "/^${BEGIN//\//\\/}\$/,/^${END//\//\\/}\$/d" "$1"
}

add() { # file: append our block (stdin) between the markers, replacing an older one
  local file=$1
  strip "$file"
  { echo "$BEGIN"; cat; echo "$END"; } >>"$file"
}

node_on() {
  add /etc/fleetyield/agent.toml <<EOF
[attest]
# Hand-over (agent -> controller): nonce from the push listener, quote signed with node.key, verdict back.
controller_url = "http://fleetyield:9402"
controller_pubkey = "$PUB"
EOF
  add /etc/fleetyield/hooks.conf <<EOF
attest = true
attest_controller_pubkey = $PUB
EOF
}

controller_on() {
  add /etc/fleetyield/fleetyield.toml <<EOF
[attest]
enabled = true
db = "$ATTEST_DIR/attest.db"
policy = "$ATTEST_DIR/policy.json"
key = "$ATTEST_DIR/fy-attest.key"
EOF
}

(($# >= 1)) || usage
case "$1" in
  status)
    for f in /etc/fleetyield/agent.toml /etc/fleetyield/hooks.conf /etc/fleetyield/fleetyield.toml; do
      if [[ -f $f ]] && grep -qxF "$BEGIN" "$f"; then echo on; exit 0; fi
    done
    echo off; exit 3 ;;
  node)
    case "${2:-}" in
      on) node_on ;;
      off) strip /etc/fleetyield/agent.toml; strip /etc/fleetyield/hooks.conf ;;
      *) usage ;;
    esac ;;
  controller)
    case "${2:-}" in
      on) controller_on ;;
      off) strip /etc/fleetyield/fleetyield.toml ;;
      *) usage ;;
    esac ;;
  *) usage ;;
esac
