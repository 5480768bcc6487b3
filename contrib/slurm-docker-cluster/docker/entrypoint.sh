#!/bin/bash
# Entrypoint of the FleetYield docker Slurm cluster image (runs under tini).
#   fleetyield-entrypoint mariadb|postgres|slurmdbd|slurmctld|slurmd|controller|shell [args...]
# slurmd role: runs slurmd AND the FleetYield node agent; the agent is restarted with backoff
# when it exits, slurmd exiting ends the container (the compose restart policy brings it back).
# controller role: runs the FleetYield controller, supervised the same way.  Both supervised
# processes are controlled with fy-service (docker/fy-service.sh).
set -uo pipefail
ROLE=${1:-shell}
shift || true
DB_PASS=${FLEETYIELD_DB_PASS:-fleetyield-test}

log() { echo "[fleetyield-entrypoint $(hostname) $ROLE $(date +%T)] $*" >&2; }

wait_for() { # description command... : poll until the command succeeds (5 min deadline)
  local what=$1 deadline=$((SECONDS + 300))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "gave up waiting for $what"; exit 1; }
    sleep 0.5
  done
}
# Ask the daemons themselves (a bare TCP probe makes slurmctld log "Zero Bytes were transmitted").
slurmctld_up() { scontrol ping | grep -q 'is UP'; }

setup_munge() {
  # One key for the cluster, created by whoever comes first, on the shared munge-key volume.
  local key=/etc/munge-shared/munge.key
  (
    flock 9
    if [[ ! -s $key ]]; then
      log "creating munge key"
      dd if=/dev/urandom of="$key.tmp" bs=1024 count=1 status=none && mv "$key.tmp" "$key"
    fi
  ) 9>/etc/munge-shared/.lock
  install -o munge -g munge -m 0400 "$key" /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force
  local deadline=$((SECONDS + 30))
  until munge -n </dev/null | unmunge >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "munged not working"; exit 1; }
    sleep 0.2
  done
}

# Run "$@" in the foreground as the container's main process, forwarding TERM/INT.
# Helper processes listed in HELPERS are stopped when it ends.
HELPERS=()
main_process() {
  "$@" &
  local main=$!
  local stopping=0
  trap 'log "stopping"; stopping=1; kill -TERM $main "${HELPERS[@]}" 2>/dev/null' TERM INT
  wait $main; local rc=$?
  # wait returns early (>128) when a trapped signal arrives: wait for the real exit.
  while kill -0 $main 2>/dev/null; do wait $main; rc=$?; done
  if ((${#HELPERS[@]})); then
    kill -TERM "${HELPERS[@]}" 2>/dev/null
    wait "${HELPERS[@]}" 2>/dev/null
  fi
  if ((stopping)); then log "$1 stopped"; exit 0; fi
  log "$1 exited with status $rc"
  exit $rc
}

# Keep "$@" running: restart it with exponential backoff (1 s .. 30 s; reset after 60 s of uptime).
# Controllable with fy-service (docker/fy-service.sh): the child's pid is in /run/fleetyield/NAME.pid;
# while /run/fleetyield/NAME.disabled exists the child is not (re)started, and an exit caused by
# `fy-service stop` is not a crash (no backoff: `fy-service start` brings it back within ~0.1 s).
FY_RUN=/run/fleetyield
supervise() { # name cmd...
  local name=$1 child=0 backoff=1 started rc
  shift
  install -d "$FY_RUN"
  rm -f "$FY_RUN/$name.pid" "$FY_RUN/$name.disabled"  # left over from before a container restart
  (
    pidfile="$FY_RUN/$name.pid" flag="$FY_RUN/$name.disabled"
    trap 'kill -TERM $child 2>/dev/null; wait $child 2>/dev/null; rm -f "$pidfile"; exit 0' TERM INT
    while :; do
      if [[ -e $flag ]]; then sleep 0.1 & wait $!; continue; fi
      started=$SECONDS
      "$@" &
      child=$!
      echo "$child" >"$pidfile"
      wait $child; rc=$?
      rm -f "$pidfile"
      if [[ -e $flag ]]; then log "$name stopped on request (status $rc)"; backoff=1; continue; fi
      ((SECONDS - started > 60)) && backoff=1
      log "$name exited with status $rc; restarting in ${backoff} s"
      sleep $backoff & wait $!
      backoff=$((backoff < 30 ? backoff * 2 : 30))
    done
  ) &
  HELPERS+=($!)
}

# The shared secret agents sign their pushes with (HMAC), on the fleetyield-secret volume: created by
# whichever container comes first (like the munge key), mode 0600, root-owned.
PUSH_SECRET=${FLEETYIELD_PUSH_SECRET_FILE:-/etc/fleetyield-secret/push.secret}
setup_push_secret() {
  install -d -m 0700 "$(dirname "$PUSH_SECRET")"
  (
    flock 9
    if [[ ! -s $PUSH_SECRET ]]; then
      log "creating the push secret"
      (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PUSH_SECRET.tmp") \
        && mv "$PUSH_SECRET.tmp" "$PUSH_SECRET"
    fi
  ) 9>"$(dirname "$PUSH_SECRET")/.lock"
  chmod 0600 "$PUSH_SECRET"
}

# slurmrestd (issue #29) beside slurmctld: JWT auth on 0.0.0.0:6820 as the unprivileged `slurmrest`
# user, and a JWT for root (the controller's Slurm user) in /shared/slurmrest/token (0600, root: a JWT is a
# password, and the compute nodes mount /shared too), renewed every
# hour (lifespan one day), for the FleetYield controller's REST adapter ([slurm] adapter = "rest").
REST_TOKEN=/shared/slurmrest/token
rest_token_loop() {
  install -d -m 0700 "$(dirname "$REST_TOKEN")"
  while :; do
    if slurmctld_up; then
      tok=$(scontrol token username=root lifespan=86400 2>/dev/null | sed -n 's/^SLURM_JWT=//p')
      if [[ -n $tok ]]; then
        (umask 077 && printf '%s\n' "$tok" >"$REST_TOKEN.tmp") && mv "$REST_TOKEN.tmp" "$REST_TOKEN"
        sleep 3600 & wait $!
        continue
      fi
    fi
    sleep 1 & wait $!
  done
}
start_slurmrestd() {
  command -v slurmrestd >/dev/null || return 0
  # No --privileged here: slurmrestd may not unshare its IPC/mount namespaces, so that hardening is off.
  supervise slurmrestd env SLURM_JWT=daemon SLURMRESTD_SECURITY=disable_unshare_sysv,disable_unshare_files setpriv --reuid=slurmrest --regid=slurmrest --clear-groups \
    slurmrestd -a rest_auth/jwt 0.0.0.0:6820
  rest_token_loop &
  HELPERS+=($!)
}

# The node agent, (re)started by supervise: its push destinations are read at every start, so that
# /etc/fleetyield/agent.toml may name them (push_url = [...], e.g. both controllers of the HA setup) and an
# agent restart picks them up; without push_url there, the container's FLEETYIELD_PUSH_URL (space-separated).
run_agent() {
  local push=() config=() url
  [[ -f /etc/fleetyield/agent.toml ]] && config=(--config /etc/fleetyield/agent.toml)
  if ((${#config[@]})) && grep -Eq '^[[:space:]]*push_url[[:space:]]*=' /etc/fleetyield/agent.toml; then
    push=(--push-secret-file "$PUSH_SECRET")
  elif [[ -n ${FLEETYIELD_PUSH_URL:-} ]]; then
    for url in $FLEETYIELD_PUSH_URL; do push+=(--push-url "$url"); done
    push+=(--push-secret-file "$PUSH_SECRET")
  fi
  # shellcheck disable=SC2086
  exec fleetyield-agent serve "${config[@]}" --backend fake \
    --gpus "${FLEETYIELD_GPUS:-8}" --model "${FLEETYIELD_GPU_MODEL:-h100}" \
    --seed "${FLEETYIELD_AGENT_SEED:-0}" --hostname "$(hostname)" --port 9400 \
    --state-dir /var/lib/fleetyield-agent --hpc-job-mapping-dir /run/fleetyield/hpc-jobs \
    "${push[@]}" ${FLEETYIELD_AGENT_EXTRA_ARGS:-}
}

# A database server started in the background as PID: stop it on TERM/INT, and poll CMD... until it answers
# (120 s; giving up when the server died). Then serve_database marks the container ready and waits for the
# server, exiting with its status.
await_database() { # name pid cmd...
  local name=$1 pid=$2 deadline=$((SECONDS + 120))
  shift 2
  trap "kill -TERM $pid" TERM INT
  until "$@" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { log "$name died"; exit 1; }
    ((SECONDS < deadline)) || { log "$name did not answer"; exit 1; }
    sleep 0.3
  done
}
serve_database() { # name pid
  local rc
  log "$1 ready"
  touch /run/fleetyield-ready
  wait "$2"; rc=$?
  while kill -0 "$2" 2>/dev/null; do wait "$2"; rc=$?; done
  exit $rc
}

case "$ROLE" in
postgres)
  # PostgreSQL from Debian: the shared store of the HA controllers (docker-compose.ha.yml), data on the
  # `postgres` volume. Database and role `fleetyield`, password auth from the cluster network.
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  PGDATA=/var/lib/fleetyield-pg/data
  install -d -o postgres -g postgres -m 0700 "$PGDATA"
  install -d -o postgres -g postgres /run/postgresql
  if [[ ! -s $PGDATA/PG_VERSION ]]; then
    log "initialising the PostgreSQL data directory"
    runuser -u postgres -- "$pgbin/initdb" -D "$PGDATA" -U postgres -E UTF8 \
      --auth-local=peer --auth-host=scram-sha-256 >/dev/null
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  fi
  runuser -u postgres -- "$pgbin/postgres" -D "$PGDATA" -c listen_addresses='*' &
  db=$!
  await_database postgres $db runuser -u postgres -- "$pgbin/pg_isready" -q -h /run/postgresql
  PG_PASS=${FLEETYIELD_PG_PASS:-fleetyield-test}
  runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 -h /run/postgresql <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fleetyield') THEN
    CREATE ROLE fleetyield LOGIN PASSWORD '$PG_PASS';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE fleetyield OWNER fleetyield' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = 'fleetyield')\\gexec
SQL
  serve_database PostgreSQL $db
  ;;
mariadb)
  install -d -o mysql -g mysql /run/mysqld
  if [[ ! -d /var/lib/mysql/mysql ]]; then
    log "initialising MariaDB datadir"
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >/dev/null
  fi
  chown -R mysql:mysql /var/lib/mysql
  mariadbd --user=mysql --bind-address=0.0.0.0 --innodb-lock-wait-timeout=900 \
    --innodb-buffer-pool-size=512M --skip-name-resolve &
  db=$!
  await_database mariadbd $db mariadb-admin ping --silent
  mariadb <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';
FLUSH PRIVILEGES;
SQL
  serve_database MariaDB $db
  ;;
slurmdbd)
  setup_munge
  deadline=$((SECONDS + 300))
  until mariadb -h mariadb -u slurm -p"$DB_PASS" -e 'SELECT 1' slurm_acct_db >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "MariaDB not reachable"; exit 1; }
    sleep 0.5
  done
  main_process slurmdbd -D
  ;;
slurmctld)
  setup_munge
  install -d -o slurm -g slurm /var/spool/slurmctld
  wait_for slurmdbd sacctmgr -n list cluster format=cluster
  # slurmctld registers itself too, but only once it is up; register first so the first jobs
  # are accounted.  Fails harmlessly when the cluster exists.
  sacctmgr -i add cluster "$(sed -n 's/^ClusterName=//p' /etc/slurm/slurm.conf)" >/dev/null 2>&1 || true
  # Hot spares (slurm/fleetyield-spares.conf): the preemptible QOS, and the default QOS may preempt it.
  # Idempotent: `add` fails harmlessly when the QOS exists, `modify` sets the same values again.
  sacctmgr -i add qos fy_preemptible >/dev/null 2>&1 || true
  sacctmgr -i modify qos where name=fy_preemptible set PreemptMode=requeue >/dev/null
  sacctmgr -i modify qos where name=normal set Preempt=fy_preemptible >/dev/null
  start_slurmrestd
  main_process slurmctld -D
  ;;
slurmd)
  setup_munge
  # Fake GPUs: character devices (major 195 like /dev/nvidiaN) for gres.conf File=.
  for ((i = 0; i < ${FLEETYIELD_GPUS:-8}; i++)); do
    [[ -c /dev/nvidia$i ]] || mknod -m 0666 "/dev/nvidia$i" c 195 "$i"
  done
  install -d /var/spool/slurmd /var/lib/fleetyield-agent /run/fleetyield/hpc-jobs
  # Checkpoint convention (prolog_epilog/epilog.py): jobs write `date +%s > .../ckpt/$SLURM_JOB_ID`.
  install -d -m 1733 /var/spool/fleetyield/ckpt
  # Booting after `scontrol reboot` (docker/fleetyield-docker-reboot.sh left the marker) or after a power
  # cut (contrib/redfish/power_bridge.py left POWER_LOST in the stopped container when the emulated BMC
  # turned the node off): power-cycle every fake GPU before the agent starts, and let slurmd report this
  # start as the boot time (-b), which is what tells slurmctld that the reboot it issued is done.
  slurmd_args=()
  POWER_LOST=/var/spool/fleetyield/power-lost
  if [[ -e /var/spool/fleetyield-reboot/requested || -e $POWER_LOST ]]; then
    why="a reboot requested by slurmctld"
    [[ -e $POWER_LOST ]] && why="a power cut by the BMC ($(cat "$POWER_LOST" 2>/dev/null))"
    log "booting after $why: power-cycling the fake GPUs, slurmd -b"
    if command -v fleetyield-agent >/dev/null; then
      for ((i = 0; i < ${FLEETYIELD_GPUS:-8}; i++)); do
        fleetyield-agent reset --gpu "$i" --backend fake --state-dir /var/lib/fleetyield-agent >/dev/null 2>&1 \
          || log "WARNING: power-on reset of fake GPU $i failed"
      done
    fi
    echo "$(date +%s.%N) booted: fake GPUs power-cycled, slurmd -b (after $why)" >>/var/log/fleetyield/reboot.log
    rm -f /var/spool/fleetyield-reboot/requested "$POWER_LOST"
    slurmd_args=(-b)
  fi
  if command -v fleetyield-agent >/dev/null && fleetyield-agent --help >/dev/null 2>&1; then
    [[ -n ${FLEETYIELD_PUSH_URL:-} ]] && setup_push_secret
    # Stop/start/wipe it with `fy-service agent stop|start|restart [--wipe]` (slurmd keeps running).
    supervise agent run_agent
  else
    log "WARNING: fleetyield-agent is not installed in this image; node agent not started"
  fi
  wait_for slurmctld slurmctld_up
  main_process slurmd -D "${slurmd_args[@]}"
  ;;
controller)
  # The FleetYield controller: slurm client + munge key + /etc/fleetyield/fleetyield.toml + the push
  # secret.  The command ("$@", e.g. fleetyield run --config ...) runs supervised, so that tests and
  # admins can stop, restart or wipe it (`fy-service controller stop|start|restart [--wipe]`) without
  # recreating the container; the container's main process only waits for TERM.
  setup_munge
  setup_push_secret
  install -d /var/lib/fleetyield
  wait_for slurmctld slurmctld_up
  if (($# == 0)); then set -- fleetyield --help; fi
  supervise controller "$@"
  main_process sleep infinity
  ;;
shell)
  exec bash "$@"
  ;;
*)
  exec "$ROLE" "$@"
  ;;
esac
