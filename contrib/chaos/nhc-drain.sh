#!/bin/bash
# NHC emulation for the bare-Slurm arm of `fleetyield chaos ab`: drain a node after a job on it failed with a
# GPU fault (exit 86 from fy-train-job.sh), as a site's Node Health Check would: the bare arm learns of a fault
# only from a job that died of it. Runs in slurmctld; polls sacct. Usage: nhc-drain.sh [interval_s] [since]
# since: only jobs since then (default: this script's start, so a previous run's failures drain nothing).
INTERVAL=${1:-5}
echo $$ > /shared/fy-chaos/nhc.pid  # `fleetyield chaos ab` stops this script by this pid
SINCE=${2:-$(date +%Y-%m-%dT%H:%M:%S)}
declare -A seen
while true; do
  while IFS='|' read -r id state code nodes; do
    [ -n "${seen[$id]:-}" ] && continue
    if [ "$state" = "FAILED" ] && [ "${code%%:*}" = "86" ]; then
      for n in $(scontrol show hostnames "$nodes"); do
        scontrol update NodeName="$n" State=DRAIN Reason="nhc: job $id failed with a GPU fault"
        echo "nhc-drain: drained $n after job $id"
      done
      seen[$id]=1
    fi
  done < <(sacct -X -n -P -S "$SINCE" -o JobID,State,ExitCode,NodeList 2>/dev/null)
  sleep "$INTERVAL"
done
