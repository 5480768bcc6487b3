#!/usr/bin/env bash
# Tear down the FleetYield docker Slurm cluster: containers, volumes and the network that up.sh
# created.  Images are kept (warm restarts).  Stops dockerd only if up.sh started it.
#   down.sh --images   also remove the cluster and base images
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

if pick_docker; then
  log "removing containers, volumes and network of project $COMPOSE_PROJECT_NAME"
  # With the HA override too, so that the standby (fleetyield-b) and its volume go as well.
  FLEETYIELD_HA=1 compose down -v --remove-orphans --timeout 10 2>&1 | sed 's/^/  /' >&2
  if [[ ${1:-} == --images ]]; then
    "$DOCKER" image rm -f "$FLEETYIELD_IMAGE" "$LOCAL_BASE_IMAGE" >/dev/null 2>&1 || true
  fi
else
  log "no docker daemon reachable: nothing to remove"
fi

pidfile="$STATE_DIR/dockerd.pid"
if [[ -s $pidfile ]]; then
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]]; then
    log "stopping the dockerd that up.sh started (pid $pid)"
    kill -TERM "$pid"
    deadline=$((SECONDS + 60))
    while kill -0 "$pid" 2>/dev/null; do
      ((SECONDS < deadline)) || { log "dockerd did not stop; sending KILL"; kill -KILL "$pid"; break; }
      sleep 0.5
    done
  fi
  rm -f "$pidfile"
fi
log "down"
