#!/bin/bash
# fy-service: control a process the cluster entrypoint supervises, without touching the rest of the
# container (slurmd keeps running when the agent stops).
#   fy-service agent|controller status|stop|start|restart [--wipe]
#     stop     stop it and keep it stopped (the supervisor does not restart it)
#     start    let the supervisor start it again (within ~0.1 s) and wait until it runs
#     restart  stop + start; --wipe: delete its state in between
#                agent:      the fake GPU state, fatal.json, the push spool and the attestation verdict
#                            (/var/lib/fleetyield-agent) -- NOT the node's attestation key (node.key,
#                            node.pub): it is enrolled with the controller, a new one would fail every quote
#                controller: the SQLite store (/var/lib/fleetyield/fleetyield.db*) and the gate
#                            (/var/lib/fleetyield/gate: proposals, nonces, audit log; not admin/ keys)
#     status   "running <pid>" (exit 0) or "stopped" (exit 3)
#     kill9    crash it: SIGKILL, no clean shutdown, and let the supervisor start it again at once (no
#              crash backoff, so crash tests can kill it many times in a row); prints the killed pid
# How: the entrypoint's supervise() keeps the child's pid in /run/fleetyield/NAME.pid and does not
# (re)start it while /run/fleetyield/NAME.disabled exists.
set -euo pipefail
RUN_DIR=/run/fleetyield
usage() { echo "usage: fy-service agent|controller status|stop|start|restart [--wipe]|kill9 [--stay-down]" >&2; exit 2; }
(($# >= 2)) || usage
name=$1 op=$2 wipe=0 stay_down=0
[[ ${3:-} == --wipe ]] && wipe=1
[[ ${3:-} == --stay-down ]] && stay_down=1
case "$name" in
  agent) state=(/var/lib/fleetyield-agent) ;;
  controller) state=(/var/lib/fleetyield/fleetyield.db /var/lib/fleetyield/fleetyield.db-wal
                     /var/lib/fleetyield/fleetyield.db-shm /var/lib/fleetyield/gate) ;;
  *) usage ;;
esac
pidfile="$RUN_DIR/$name.pid" flag="$RUN_DIR/$name.disabled"

running_pid() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop() {
  touch "$flag"
  local pid deadline=$((SECONDS + 15))
  pid=$(running_pid) || return 0
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.05
  done
}

start() {
  rm -f "$flag"
  local deadline=$((SECONDS + 15))
  until running_pid >/dev/null; do
    ((SECONDS < deadline)) || { echo "fy-service: $name did not start" >&2; exit 1; }
    sleep 0.05
  done
}

wipe_state() {
  if [[ $name == agent ]]; then
    find "${state[0]}" -mindepth 1 ! -path "${state[0]}/node.key" ! -path "${state[0]}/node.pub" -delete
  else
    rm -rf "${state[@]}"
  fi
}

case "$op" in
  status) if pid=$(running_pid); then echo "running $pid"; else echo stopped; exit 3; fi ;;
  stop) stop ;;
  start) start ;;
  restart) stop; ((wipe)) && wipe_state; start ;;
  kill9)
    pid=$(running_pid) || { echo "fy-service: $name is not running" >&2; exit 3; }
    touch "$flag"  # the supervisor then treats the exit as requested: no backoff
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
    echo "$pid"
    ((stay_down)) || start ;;
  *) usage ;;
esac
