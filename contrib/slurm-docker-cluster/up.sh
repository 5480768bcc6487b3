#!/usr/bin/env bash
# Bring up the FleetYield docker Slurm cluster and wait until every node is idle.
#   up.sh [--build-only]
# Idempotent: re-running on a running cluster rebuilds what changed and recreates changed containers.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
T0=$SECONDS
mkdir -p "$BUILD_DIR" "$STATE_DIR"

# ---- 1. host tools -------------------------------------------------------------------------
ensure_host_tools() {
  local missing=()
  command -v docker >/dev/null || missing+=(docker.io)
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v iptables >/dev/null || missing+=(iptables)
  if [[ $BASE_IMAGE == "$LOCAL_BASE_IMAGE" ]]; then
    command -v debootstrap >/dev/null || missing+=(debootstrap)
  fi
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}; install them (needs root)"
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
}

# ---- 2. docker daemon ----------------------------------------------------------------------
ensure_dockerd() {
  pick_docker && return 0
  [[ $(id -u) == 0 ]] || die "no docker daemon reachable and not root: start docker first"
  log "no docker daemon running: starting dockerd (down.sh will stop it)"
  # dockerd outlives this script: close every inherited descriptor above 2 first, or a lock the caller
  # holds (`flock /tmp/fy-cluster.lock make up`) stays held by dockerd for ever (it happened).
  (
    for fd in $(ls "/proc/$BASHPID/fd"); do
      if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec nohup dockerd >"$STATE_DIR/dockerd.log" 2>&1
  ) &
  echo $! >"$STATE_DIR/dockerd.pid"
  local deadline=$((SECONDS + 90))
  until pick_docker; do
    ((SECONDS < deadline)) || { tail -30 "$STATE_DIR/dockerd.log" >&2; die "dockerd did not come up in 90 s"; }
    kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null \
      || { tail -30 "$STATE_DIR/dockerd.log" >&2; die "dockerd exited"; }
    sleep 0.5
  done
  log "dockerd up ($DOCKER)"
}

# ---- 3. base image (no registry: debootstrap + docker import) -------------------------------
ensure_base_image() {
  "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
  [[ $BASE_IMAGE == "$LOCAL_BASE_IMAGE" ]] || die "base image $BASE_IMAGE not present (docker pull it)"
  local tarball="$BUILD_DIR/rootfs-$DEBIAN_SUITE.tar"
  if [[ ! -s $tarball ]]; then
    local dir="$BUILD_DIR/rootfs-$DEBIAN_SUITE"
    rm -rf "$dir"
    log "debootstrap $DEBIAN_SUITE (minbase) -> $dir"
    debootstrap --variant=minbase "$DEBIAN_SUITE" "$dir" http://deb.debian.org/debian >"$BUILD_DIR/debootstrap.log" 2>&1 \
      || { tail -30 "$BUILD_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
  fi
  log "importing $tarball as $BASE_IMAGE"
  "$DOCKER" import "$tarball" "$BASE_IMAGE" >/dev/null
}

# ---- 4. wheelhouse (containers never reach PyPI) -------------------------------------------
host_python() {
  if [[ ! -x $REPO_ROOT/.venv/bin/pip ]]; then
    log "creating $REPO_ROOT/.venv"
    python3 -m venv "$REPO_ROOT/.venv"
    "$REPO_ROOT/.venv/bin/pip" install -q -e "$REPO_ROOT[dev]"
  fi
  echo "$REPO_ROOT/.venv/bin/python"
}

build_wheelhouse() {
  local py deps key
  py=$(host_python)
  # One image serves every role (GPU nodes and the controller): the default dependencies plus the
  # controller's extra (pyproject [project.optional-dependencies] controller: sushy for Redfish), and the
  # build backend ([build-system] requires), with which the image build makes the Debian package offline.
  deps=$("$py" - "$REPO_ROOT/pyproject.toml" <<'PY'
import sys, tomllib
cfg = tomllib.load(open(sys.argv[1], "rb"))
project = cfg["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["controller"]
                + cfg["build-system"]["requires"]))
PY
)
  key=$(printf '%s\n%s\n' "$IMAGE_PYTHON" "$deps" | sha256sum | cut -c1-16)
  local wdir="$BUILD_DIR/wheels/py$IMAGE_PYTHON"
  if [[ $(cat "$wdir/deps/.key" 2>/dev/null) != "$key" ]]; then
    log "downloading third-party wheels for python $IMAGE_PYTHON"
    rm -rf "$wdir/deps" && mkdir -p "$wdir/deps"
    local abi="cp${IMAGE_PYTHON/./}"
    # shellcheck disable=SC2086
    "$py" -m pip download -q --disable-pip-version-check -d "$wdir/deps" \
      --only-binary=:all: --python-version "$IMAGE_PYTHON" --implementation cp \
      --abi "$abi" --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 \
      --platform manylinux1_x86_64 --platform linux_x86_64 --platform any \
      $(echo "$deps" | tr '\n' ' ') >"$BUILD_DIR/pip-download.log" 2>&1 \
      || { grep -v 'is ignored' "$BUILD_DIR/pip-download.log" | tail -30 >&2; die "pip download failed"; }
    echo "$key" >"$wdir/deps/.key"
  fi
  # The package's sources: what contrib/deb/build-deb.sh reads (the image build runs it, offline, from
  # the wheelhouse above, and installs the .deb it makes: the cluster runs what admins install). Copied
  # fresh each time without bytecode; docker compares contents, so an unchanged tree reuses the cached
  # package layer and containers are not recreated.
  log "staging the Debian package's sources"
  local src="$BUILD_DIR/deb/src"
  rm -rf "$BUILD_DIR/deb" && mkdir -p "$src"
  local inputs
  mapfile -t inputs < <("$REPO_ROOT/contrib/deb/build-deb.sh" --inputs)
  (cd "$REPO_ROOT" && tar -c --exclude=__pycache__ --exclude='*.pyc' "${inputs[@]}") | tar -x -C "$src"
}

build_image() {
  log "docker build $FLEETYIELD_IMAGE (base $BASE_IMAGE, Slurm $SLURM_VERSION)"
  "$DOCKER" build -q -t "$FLEETYIELD_IMAGE" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg SLURM_VERSION="$SLURM_VERSION" \
    --build-arg WHEELS="build/wheels/py$IMAGE_PYTHON" \
    "$CLUSTER_DIR" >"$BUILD_DIR/docker-build.log" 2>&1 \
    || { tail -40 "$BUILD_DIR/docker-build.log" >&2; die "docker build failed (log: $BUILD_DIR/docker-build.log)"; }
}

# ---- 5. start and wait ---------------------------------------------------------------------
diagnose() {
  log "---- diagnostics ----"
  compose ps >&2 || true
  local c
  for c in mariadb postgres slurmdbd slurmctld "${NODES[@]}" fleetyield; do
    echo "----- docker logs --tail 25 $c -----" >&2
    "$DOCKER" logs --tail 25 "$c" >&2 2>&1 || true
  done
  echo "----- sinfo -----" >&2
  "$DOCKER" exec slurmctld sinfo -N -l >&2 2>&1 || true
  "$DOCKER" exec slurmctld scontrol show node -o >&2 2>&1 || true
}

wait_idle() {
  local deadline=$((SECONDS + ${UP_TIMEOUT:-300})) last="" now
  log "waiting for ${#NODES[@]} nodes to be idle (timeout ${UP_TIMEOUT:-300} s)"
  while :; do
    now=$("$DOCKER" exec slurmctld sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    if [[ $now != "$last" ]]; then log "sinfo: ${now:-(slurmctld not answering yet)}"; last=$now; fi
    local n st idle=0 settled=0 busy=()
    for n in "${NODES[@]}"; do
      st=$(grep -o " $n=[^ ]*" <<<" $now" | cut -d= -f2 || true)
      [[ $st == idle ]] && idle=$((idle + 1))
      # Registered and responding, but not idle (drained by FleetYield, running jobs, ...).
      if [[ -n $st && $st != *'*'* && ! $st =~ ^(unk|down|inval|fail|idle) ]]; then busy+=("$n=$st"); fi
      [[ -n $st && $st != *'*'* && ! $st =~ ^(unk|down|inval|fail) ]] && settled=$((settled + 1))
    done
    ((idle == ${#NODES[@]})) && return 0
    # A node kept DRAINED in slurmctld's saved state (or busy with jobs) will not turn idle by
    # waiting: accept a cluster where every node has registered, after 15 s, with a warning.
    if ((settled == ${#NODES[@]})); then
      : "${settled_since:=$SECONDS}"
      if ((SECONDS - settled_since >= 15)); then
        log "WARNING: registered but not idle: ${busy[*]} (resume with:" \
          "docker exec slurmctld scontrol update nodename=<node> state=resume)"
        return 0
      fi
    else
      unset settled_since
    fi
    ((SECONDS < deadline)) || { diagnose; die "cluster not idle after ${UP_TIMEOUT:-300} s"; }
    sleep 1
  done
}

# JobSubmitPlugins=lua ANDs an fy_ok_* feature to every job's constraint: jobs only run once the
# controller has labelled the nodes.  Wait until every node carries an fy_tier_* feature from fresh
# data (not fy_tier_unknown).
wait_labelled() {
  local deadline=$((SECONDS + ${LABEL_TIMEOUT:-120})) out missing n
  log "waiting for the FleetYield controller to label every node (fy_tier_*)"
  while :; do
    out=$("$DOCKER" exec slurmctld scontrol show node -o 2>/dev/null || true)
    missing=()
    for n in "${NODES[@]}"; do
      # fy_tier_unknown: labelled, but the controller has no data from the node's agent yet.
      grep -E "^NodeName=$n " <<<"$out" | grep -oE 'AvailableFeatures=[^ ]*' | tr ',=' '\n\n' \
        | grep -E '^fy_tier_' | grep -qv '^fy_tier_unknown$' || missing+=("$n")
    done
    ((${#missing[@]} == 0)) && return 0
    if ((SECONDS >= deadline)); then
      diagnose
      "$DOCKER" exec fleetyield fleetyield status >&2 2>&1 || true
      die "controller did not label ${missing[*]} within ${LABEL_TIMEOUT:-120} s"
    fi
    sleep 0.5
  done
}

# PostgreSQL (the HA controllers' store) answers: initdb on a fresh volume takes a few seconds.
wait_postgres() {
  local deadline=$((SECONDS + ${PG_TIMEOUT:-120}))
  log "waiting for PostgreSQL (container postgres)"
  until "$DOCKER" exec postgres test -e /run/fleetyield-ready 2>/dev/null \
    && "$DOCKER" exec postgres runuser -u postgres -- psql -qtA -h /run/postgresql -d fleetyield \
      -c 'SELECT 1' >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      "$DOCKER" logs --tail 30 postgres >&2 2>&1 || true
      die "PostgreSQL did not answer within ${PG_TIMEOUT:-120} s"
    fi
    sleep 0.5
  done
}

ensure_host_tools
ensure_dockerd
ensure_base_image
build_wheelhouse
build_image
if [[ ${1:-} == --build-only ]]; then log "built $FLEETYIELD_IMAGE in $((SECONDS - T0)) s"; exit 0; fi
# A cluster network from before fixed addresses (or on another FLEETYIELD_NET): compose refuses to reuse it.
want_subnet="${FLEETYIELD_NET:-10.213.37}.0/24"
have_subnet=$("$DOCKER" network inspect fleetyield-cluster -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' 2>/dev/null || true)
if [[ -n $have_subnet && $have_subnet != "$want_subnet" ]]; then
  log "network fleetyield-cluster is on $have_subnet, not $want_subnet: recreating the cluster's containers"
  compose down --remove-orphans --timeout 10 2>&1 | sed 's/^/  /' >&2
fi
log "starting containers (compose project $COMPOSE_PROJECT_NAME)"
compose up -d --remove-orphans 2>&1 | sed 's/^/  /' >&2
wait_postgres
wait_idle
wait_labelled
if [[ ${FLEETYIELD_ATTEST:-0} == 1 ]]; then
  "$CLUSTER_DIR/attest.sh" on # enrol, baseline, switch on, wait for every node's first verdict
fi
log "cluster up: ${#NODES[@]} nodes registered and labelled by the controller after $((SECONDS - T0)) s"
