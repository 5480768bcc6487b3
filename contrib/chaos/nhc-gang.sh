#!/bin/bash
# Node health checks and requeue-on-failure for `fleetyield chaos ab-gang` (slurm_fleetyield/chaos/gang_ab.py),
# both arms alike. Runs in slurmctld. Usage: nhc-gang.sh FAULT_DIR [health_check_interval_s] [phase_s] [log]
# - NHC emulation: every health_check_interval_s (Slurm's HealthCheckInterval running LBNL NHC; the simulator's
#   health_check_interval_s, 300 s by default, scaled down with the rest of the gang profile; the first check
#   phase_s after the start: NHC's timer is not aligned with a fault, the driver draws it from the seed), drain every node
#   whose GPU is dead: a fault record FAULT_DIR/<node> ("<unix time> <gpu> <xid>", written by the chaos driver
#   with the SIMULATED fault) the node has not rebooted since. A node already drained (by FleetYield, or by an
#   earlier pass) is left alone, as NHC leaves a node drained with another reason. Draining does not kill the
#   hung job on it.
# - Requeue on failure: a job that FAILED with exit 86 (the gang's collective timeout) and allows requeue
#   (Requeue=1) is put back with `scontrol requeue` within 2 s. Slurm requeues a batch job by itself only on
#   a node failure, never after a non-zero exit: this is what a site's resubmit wrapper (or the user) does,
#   at once here, the best case for bare Slurm. In the FleetYield arm it finds nothing to do unless a hang
#   ran to its timeout (FleetYield requeues the gang before).
# Every action is a line in the log: "<unix time> drain|requeue <node|job> ...". Stopped by its pid file.
FAULT_DIR=${1:?usage: nhc-gang.sh FAULT_DIR [interval_s] [log]}
INTERVAL=${2:-30}
PHASE=${3:-0}
LOG=${4:-/shared/fy-chaos/nhc-gang.log}
echo $$ > /shared/fy-chaos/nhc.pid  # `fleetyield chaos ab|ab-gang` stops this script by this pid
declare -A requeued  # "<job> <restarts>" -> 1

booted_after() {  # 0 when node $1 booted after unix time $2
  local bt
  bt=$(scontrol show node "$1" -o 2>/dev/null | grep -o 'BootTime=[^ ]*' | cut -d= -f2)
  [ -n "$bt" ] && [ "$bt" != None ] || return 1
  bt=$(date -d "$bt" +%s 2>/dev/null) || return 1
  [ "$bt" -gt "${2%.*}" ]
}

health_check() {
  local f n ft gpu xid state
  for f in "$FAULT_DIR"/*; do
    [ -s "$f" ] || continue
    n=${f##*/}
    read -r ft gpu xid _ < "$f"
    booted_after "$n" "$ft" && continue
    state=$(scontrol show node "$n" -o 2>/dev/null | grep -o 'State=[^ ]*' | head -1)
    case "$state" in *DRAIN*|*DOWN*|*FAIL*|'') continue ;; esac
    scontrol update NodeName="$n" State=DRAIN Reason="nhc: GPU $gpu failed its health check (xid $xid)"
    echo "$EPOCHREALTIME drain $n gpu=$gpu xid=$xid" >> "$LOG"
  done
}

requeue_failed() {
  local line id restarts
  while read -r line; do
    [[ $line == *JobState=FAILED* && $line == *" ExitCode=86:0"* && $line == *" Requeue=1"* ]] || continue
    id=$(grep -o '^JobId=[0-9]*' <<< "$line" | cut -d= -f2)
    restarts=$(grep -o ' Restarts=[0-9]*' <<< "$line" | cut -d= -f2)
    [ -n "$id" ] && [ -z "${requeued["$id $restarts"]:-}" ] || continue
    requeued["$id $restarts"]=1
    scontrol requeue "$id" && echo "$EPOCHREALTIME requeue $id restarts=$restarts" >> "$LOG"
  done < <(scontrol show job -o 2>/dev/null)
}

next_check=$(( $(date +%s) + ${PHASE%.*} ))
while true; do
  if [ "$(date +%s)" -ge "$next_check" ]; then
    health_check
    next_check=$((next_check + INTERVAL))
  fi
  requeue_failed
  sleep 2
done
