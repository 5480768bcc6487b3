# shellcheck shell=bash
# Shared settings and helpers for up.sh / down.sh / demo.sh.  Source, do not run.
#
# Knobs (environment):
#   SLURM_VERSION   22.05 (default; Debian bookworm) or 24.11 (Debian trixie)
#   BASE_IMAGE      base image for the Dockerfile; default: a local image imported from debootstrap
#   UP_TIMEOUT      seconds to wait for every node to be idle (default 300)
#   LABEL_TIMEOUT   seconds to wait for the controller to label every node (default 120)
#   COMPOSE_PROJECT_NAME  default "fleetyield"
#   FLEETYIELD_ATTEST     1: up.sh switches tenant attestation on (attest.sh on); default 0 (off)
#   FLEETYIELD_HA         1: two controllers on PostgreSQL (docker-compose.ha.yml on top); default 0 (one, SQLite)

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
BUILD_DIR="$CLUSTER_DIR/build"
STATE_DIR="$CLUSTER_DIR/.state"

SLURM_VERSION=${SLURM_VERSION:-22.05}
case "$SLURM_VERSION" in
  22.05) DEBIAN_SUITE=bookworm; IMAGE_PYTHON=3.11 ;;
  24.11) DEBIAN_SUITE=trixie;   IMAGE_PYTHON=3.13 ;;
  *) echo "SLURM_VERSION must be 22.05 or 24.11 (got $SLURM_VERSION)" >&2; exit 2 ;;
esac
LOCAL_BASE_IMAGE="fleetyield/debian:$DEBIAN_SUITE"
BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE_IMAGE}
export FLEETYIELD_IMAGE=${FLEETYIELD_IMAGE:-fleetyield/slurm:$SLURM_VERSION}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-fleetyield}
NODES=(gpu-h100-1 gpu-h100-2 gpu-l40s-1 gpu-l40s-2)

log() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# /usr/local/bin/docker may be an old standalone client shadowing /usr/bin/docker: use the first
# docker binary that can talk to the daemon (or the first one found if no daemon runs yet).
pick_docker() {
  local c first=""
  for c in $(type -ap docker) /usr/bin/docker; do
    [[ -x $c ]] || continue
    [[ -n $first ]] || first=$c
    if "$c" info >/dev/null 2>&1; then DOCKER=$c; return 0; fi
  done
  DOCKER=${first:-docker}
  return 1
}

compose() {
  local files=(-f "$CLUSTER_DIR/docker-compose.yml")
  if [[ ${FLEETYIELD_HA:-0} == 1 ]]; then files+=(-f "$CLUSTER_DIR/docker-compose.ha.yml"); fi
  if command -v docker-compose >/dev/null 2>&1; then
    docker-compose "${files[@]}" "$@"
  else
    "$DOCKER" compose "${files[@]}" "$@"
  fi
}
