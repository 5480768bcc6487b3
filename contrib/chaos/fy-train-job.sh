#!/bin/bash
# FleetYield chaos job: "trains" by sleeping in steps, checkpoints, resumes after a requeue, crashes when one
# of its GPUs faults. Submitted by `fleetyield chaos run|ab` (slurm_fleetyield/chaos/runner.py):
#   sbatch --comment=fy:<class> [--requeue] --gres=gpu:N --export=ALL,FY_WORK_S=300,FY_CKPT_S=60 fy-train-job.sh
# Environment (defaults in brackets):
#   FY_WORK_S      seconds of work in total [300]          FY_CKPT_S   checkpoint every N s of work, 0: never [0]
#   FY_STEP_S      seconds per step [1]                    FY_PROGRESS_DIR  shared progress files [/shared/fy-chaos/progress]
#   FY_CKPT_DIR    epilog checkpoint spool [/var/spool/fleetyield/ckpt]
#   FY_FATAL_FILE  the node agent's fatal marker [/var/lib/fleetyield-agent/fatal.json]
# Progress file <FY_PROGRESS_DIR>/<job id>: "<work done at the last checkpoint> <unix time> <state>"; a requeued
# job (same id) resumes from it. Every checkpoint also appends "<unix time> <work done>" to
# <FY_PROGRESS_DIR>/<job id>.ckpts: the chaos ledger reads the checkpoints of every attempt from there (the
# same source in both A/B arms, whether or not a controller collects the epilog's records). Checkpoint
# convention of the epilog (prolog_epilog/epilog.py), kept too:
#   date +%s > /var/spool/fleetyield/ckpt/$SLURM_JOB_ID
# Checkpoint signals (FleetYield's convention, stake.classes.<class>.checkpoint_signals = "batch": this script
# trains in the batch shell, so FleetYield signals it with scancel --batch): SIGUSR2 -> checkpoint at the end
# of the current step and keep running (sent with a drain proposal); SIGUSR1 -> checkpoint, then
# `scontrol requeue $SLURM_JOB_ID` (sent right after an approved drain: the job restarts elsewhere from now).
#   FY_SCONTROL    scontrol to requeue with [scontrol]
# Gang mode (FY_GANG=1; `fleetyield chaos ab-gang`, slurm_fleetyield/chaos/gang_ab.py): the job stands for a
# synchronous multi-node training job (NCCL collectives across `sbatch -N3`). A dead GPU anywhere in the
# allocation stops every rank at its next collective: the job HANGS (no progress, no checkpoint, checkpoint
# signals cannot complete) until the collective timeout, then fails (exit 86), as PyTorch's process-group
# watchdog does. The dead GPU is SIMULATED: the chaos driver writes <FY_FAULT_DIR>/<node> ("<unix time> <gpu>
# <xid>") when it injects the fault into that node's agent; the job checks the records of every node of its
# allocation before it starts and after every step (a step during which a fault landed did not complete). A
# record counts until its node reboots (BootTime after the fault: the docker reboot stand-in gives the node
# fresh GPUs, which is how FleetYield's ladder repairs it); a job started on a still-dead node hangs at its
# first collective.
#   FY_FAULT_DIR   fault records [/shared/fy-chaos/faults]   FY_COLLECTIVE_TIMEOUT_S  hang before failing [600]
# Gang mode logs, beside the progress file: <job id>.steps ("<unix time> <work done>" per completed step) and
# <job id>.events ("<unix time> start|hang|timeout|done <work done> [...]"): the gang A/B's ledger reads them.
# Exit codes: 0 done (or requeued itself), 86 crashed on a GPU fault (the chaos ledger and the NHC emulation
# read this).
set -u
JOB=${SLURM_JOB_ID:?not a Slurm job}
WORK=${FY_WORK_S:-300}
CKPT=${FY_CKPT_S:-0}
STEP=${FY_STEP_S:-1}
PROG_DIR=${FY_PROGRESS_DIR:-/shared/fy-chaos/progress}
CKPT_DIR=${FY_CKPT_DIR:-/var/spool/fleetyield/ckpt}
FATAL=${FY_FATAL_FILE:-/var/lib/fleetyield-agent/fatal.json}
GPUS=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
mkdir -p "$PROG_DIR" "$CKPT_DIR" 2>/dev/null
PROG="$PROG_DIR/$JOB"

done_s=0
if [ -s "$PROG" ]; then
  read -r done_s _ _ < "$PROG"
  echo "fy-train-job $JOB: resuming at ${done_s}s of ${WORK}s (restart ${SLURM_RESTART_COUNT:-?})"
fi
last_ckpt=$done_s
# Signals are counted, never cleared: a flag reset after a checkpoint would lose a signal that arrived while
# the checkpoint was being written (USR1 then requeued the job without the checkpoint it asked for).
ckpt_asked=0    # checkpoint requests received (USR2 and USR1)
ckpt_served=0   # requests covered by a checkpoint written after them
requeue_after=0 # USR1: requeue once ckpt_served reaches this request
trap 'ckpt_asked=$((ckpt_asked + 1))' USR2
trap 'ckpt_asked=$((ckpt_asked + 1)); requeue_after=$ckpt_asked' USR1
echo "fy-train-job $JOB: training from ${done_s}s"

GANG=${FY_GANG:-0}
if [ "$GANG" = 1 ]; then
  FAULT_DIR=${FY_FAULT_DIR:-/shared/fy-chaos/faults}
  TIMEOUT=${FY_COLLECTIVE_TIMEOUT_S:-600}
  read -r -a GANG_NODES <<< "$("${FY_SCONTROL:-scontrol}" show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" | tr '\n' ' ')"
  ATTEMPT_T=$EPOCHREALTIME
  declare -A repaired  # "<node> <fault time>" -> 1 once the node rebooted after that fault
  log_event() { echo "$EPOCHREALTIME $*" >> "$PROG.events"; }
  log_event start "$done_s" "${SLURM_RESTART_COUNT:-0}" "${GANG_NODES[*]}"
fi

booted_after() {  # 0 when node $1 booted after unix time $2 (scontrol's BootTime, whole seconds)
  local bt
  bt=$("${FY_SCONTROL:-scontrol}" show node "$1" -o 2>/dev/null | grep -o 'BootTime=[^ ]*' | cut -d= -f2)
  [ -n "$bt" ] && [ "$bt" != None ] || return 1
  bt=$(date -d "$bt" +%s 2>/dev/null) || return 1
  [ "$bt" -gt "${2%.*}" ]
}

gang_check() {  # a live fault record on a node of the allocation: hang until the collective timeout, exit 86
  local n f ft gpu xid _ deadline
  for n in "${GANG_NODES[@]}"; do
    f="$FAULT_DIR/$n"
    [ -s "$f" ] || continue
    read -r ft gpu xid _ < "$f"
    [ -n "${repaired["$n $ft"]:-}" ] && continue
    if booted_after "$n" "$ft"; then repaired["$n $ft"]=1; continue; fi
    # the collective in flight at the fault (or our first one, on a node dead before we started) never returns
    if awk -v a="$ft" -v b="$ATTEMPT_T" 'BEGIN { exit !(a < b) }'; then ft=$ATTEMPT_T; fi
    deadline=$(awk -v a="$ft" -v t="$TIMEOUT" 'BEGIN { printf "%d", a + t + 0.999 }')
    log_event hang "$done_s" "$n" "$gpu" "$xid"
    echo "fy-train-job $JOB: collective hung at ${done_s}s (GPU $gpu of $n dead, xid $xid): timeout in ${TIMEOUT}s" >&2
    while [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
    log_event timeout "$done_s" "$n"
    echo "fy-train-job $JOB: collective timeout after ${TIMEOUT}s: crashing" >&2
    exit 86
  done
}

gpu_faulted() {  # 0 when the fatal marker lists one of our GPUs (or a node-wide event)
  [ -s "$FATAL" ] || return 1
  python3 - "$FATAL" "$GPUS" <<'PY' 2>/dev/null
import json, sys
try:
    pending = json.load(open(sys.argv[1])).get("pending", [])
except (OSError, ValueError):
    sys.exit(0)  # an unreadable marker is a fault (the prolog treats it so too)
mine = {int(g) for g in sys.argv[2].split(",") if g.strip().isdigit()}
sys.exit(0 if any(e.get("gpu") is None or not mine or e.get("gpu") in mine for e in pending) else 1)
PY
}

checkpoint() {
  now=$(date +%s)
  echo "$1 $now running" > "$PROG.tmp" && mv "$PROG.tmp" "$PROG"
  echo "$now $1" >> "$PROG.ckpts"
  date +%s > "$CKPT_DIR/$JOB"
}

[ "$GANG" = 1 ] && gang_check
while [ "$done_s" -lt "$WORK" ]; do
  if [ "$GANG" != 1 ] && gpu_faulted; then
    echo "fy-train-job $JOB: GPU fault on $(hostname) (gpus $GPUS) at ${done_s}s: crashing" >&2
    exit 86
  fi
  sleep "$STEP"
  [ "$GANG" = 1 ] && gang_check
  done_s=$((done_s + STEP))
  [ "$GANG" = 1 ] && echo "$EPOCHREALTIME $done_s" >> "$PROG.steps"
  asked=$ckpt_asked  # a request arriving after this line is served at the next step
  if [ "$asked" -gt "$ckpt_served" ] || { [ "$CKPT" -gt 0 ] && [ $((done_s - last_ckpt)) -ge "$CKPT" ]; }; then
    checkpoint "$done_s"
    last_ckpt=$done_s
    ckpt_served=$asked
  fi
  if [ "$requeue_after" -gt 0 ] && [ "$ckpt_served" -ge "$requeue_after" ]; then
    echo "fy-train-job $JOB: checkpointed at ${done_s}s on request: requeueing myself"
    "${FY_SCONTROL:-scontrol}" requeue "$JOB"
    exit 0
  fi
done
echo "$WORK $(date +%s) done" > "$PROG.tmp" && mv "$PROG.tmp" "$PROG"
[ "$GANG" = 1 ] && log_event done "$done_s"
echo "fy-train-job $JOB: done (${WORK}s)"
exit 0
