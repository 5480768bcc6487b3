#!/usr/bin/env bash
# Tenant-isolation attestation in the running docker cluster: the admin steps, scripted.
#   attest.sh on       enable it: controller key (once), enrol every node's key, learn the policy from one
#                      golden node per class, switch agents / hooks / controller on, wait until every node
#                      holds a fresh passing verdict
#   attest.sh off      back to the default (attestation off); keys, enrolments and the policy are kept
#   attest.sh status   on/off per container, and the controller's enrolments with their latest verdicts
# `FLEETYIELD_ATTEST=1 make up` runs `attest.sh on` after bringing the cluster up.
#
# Why off by default: the Prolog's verdict check is fail-closed (no fresh passing verdict -> the job is
# refused and Slurm drains the node), which is what attestation is for, but the rest of the integration
# suite stops/kills the controller and wipes agents in the middle of running jobs; see README.md
# "Attestation" for what was tried.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
pick_docker || die "no docker daemon reachable"

CTL=fleetyield
ATTEST_DIR=/var/lib/fleetyield/attest
DB=$ATTEST_DIR/attest.db
AGENT_STATE=/var/lib/fleetyield-agent
GOLDEN=(gpu-h100-1 gpu-l40s-1) # one trusted node per class: the baseline is learnt from its quote
VERDICT_TIMEOUT=${ATTEST_TIMEOUT:-90}

dx() { "$DOCKER" exec "$@"; }
node_class() { local n=${1#gpu-}; echo "${n%%-*}"; } # gpu-h100-1 -> h100

on() {
  local t0 n line nonce class
  t0=$(date +%s)
  log "controller verdict key (made once, on the fleetyield-state volume; public half to the nodes)"
  dx "$CTL" bash -c "set -e; install -d -m 0700 $ATTEST_DIR
    [[ -s $ATTEST_DIR/fy-attest.key ]] || fleetyield attest keygen --out $ATTEST_DIR --name fy-attest >/dev/null
    install -m 0644 $ATTEST_DIR/fy-attest.pub /etc/fleetyield-secret/fy-attest.pub"
  for n in "${NODES[@]}"; do dx "$n" fy-attest node on; done
  log "enrolling ${NODES[*]} (fleetyield attest enroll: the explicit admin step)"
  for n in "${NODES[@]}"; do
    line=$(dx "$n" fleetyield-agent attest pubkey --state-dir "$AGENT_STATE" --hostname "$n")
    printf '%s\n' "$line" | dx -i "$CTL" bash -c "set -e; f=\$(mktemp); cat >\$f
      fleetyield attest enroll $n --pubkey \$f --class $(node_class "$n") --db $DB >/dev/null; rm -f \$f"
  done
  log "learning the policy from the golden nodes ${GOLDEN[*]} (fleetyield attest baseline)"
  dx "$CTL" rm -f "$ATTEST_DIR/policy.new"
  for n in "${GOLDEN[@]}"; do
    class=$(node_class "$n")
    nonce=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    dx "$n" fleetyield-agent quote --state-dir "$AGENT_STATE" --config /etc/fleetyield/agent.toml --nonce "$nonce" \
      | dx -i "$CTL" bash -c "set -e; q=\$(mktemp); cat >\$q
        merge=(); [[ -s $ATTEST_DIR/policy.new ]] && merge=(--merge $ATTEST_DIR/policy.new)
        fleetyield attest baseline --quote \$q --class $class \"\${merge[@]}\" >$ATTEST_DIR/policy.tmp
        mv $ATTEST_DIR/policy.tmp $ATTEST_DIR/policy.new; rm -f \$q"
  done
  dx "$CTL" mv "$ATTEST_DIR/policy.new" "$ATTEST_DIR/policy.json"
  log "switching the controller and the agents on"
  dx "$CTL" fy-attest controller on
  dx "$CTL" fy-service controller restart
  for n in "${NODES[@]}"; do dx "$n" fy-service agent restart; done
  wait_verdicts "$t0"
  log "attestation on: every node attested (pass) after $(($(date +%s) - t0)) s"
}

# Until every node's latest verdict (controller) is a pass newer than $1 and its verdict file exists.
wait_verdicts() {
  local since=$1 deadline=$((SECONDS + VERDICT_TIMEOUT)) rows missing n
  while :; do
    rows=$(dx "$CTL" fleetyield attest nodes --db "$DB" 2>/dev/null || echo '[]')
    missing=()
    for n in "${NODES[@]}"; do
      # the row of node n: "verdict": "pass" with verdict_time >= since
      if ! python3 -c 'import json,sys; r={x["node"]: x for x in json.loads(sys.argv[1])}.get(sys.argv[2]) or {}
sys.exit(0 if r.get("verdict") == "pass" and (r.get("verdict_time") or 0) >= float(sys.argv[3]) else 1)' \
        "$rows" "$n" "$since" || ! dx "$n" test -s "$AGENT_STATE/attest-verdict.json"; then
        missing+=("$n")
      fi
    done
    ((${#missing[@]} == 0)) && return 0
    if ((SECONDS >= deadline)); then
      echo "$rows" >&2
      for n in "${missing[@]}"; do "$DOCKER" exec "$n" tail -5 /var/log/fleetyield/hooks.log >&2 2>/dev/null || true; done
      die "no fresh passing verdict within ${VERDICT_TIMEOUT} s for ${missing[*]}"
    fi
    sleep 0.5
  done
}

off() {
  local n
  # The agent stops before its config changes: a running agent that re-attests (its periodic hand-over, an
  # Epilog) after the edit quotes the new agent/config against the old policy, and that failing verdict
  # stays the node's latest: the next `attest.sh on` would quarantine the node on it.
  for n in "${NODES[@]}"; do
    dx "$n" fy-service agent stop
    dx "$n" fy-attest node off
    dx "$n" rm -f "$AGENT_STATE/attest-verdict.json" "$AGENT_STATE/attest-verdict.json.prev"
    dx "$n" fy-service agent start
  done
  dx "$CTL" fy-attest controller off
  dx "$CTL" fy-service controller restart
  log "attestation off (keys, enrolments and policy kept in $CTL:$ATTEST_DIR)"
}

status() {
  local c
  for c in "$CTL" "${NODES[@]}"; do printf '%-12s %s\n' "$c" "$(dx "$c" fy-attest status || true)"; done
  dx "$CTL" bash -c "[[ -s $DB ]] && fleetyield attest nodes --db $DB || echo '(no attestation database yet)'"
}

case "${1:-}" in
  on) on ;;
  off) off ;;
  status) status ;;
  *) echo "usage: $0 on|off|status" >&2; exit 2 ;;
esac
