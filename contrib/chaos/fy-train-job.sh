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
ckpt_now=0
requeue_now=0
trap 'ckpt_now=1' USR2
trap 'ckpt_now=1; requeue_now=1' USR1
echo "fy-train-job $JOB: training from ${done_s}s"

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

while [ "$done_s" -lt "$WORK" ]; do
  if gpu_faulted; then
    echo "fy-train-job $JOB: GPU fault on $(hostname) (gpus $GPUS) at ${done_s}s: crashing" >&2
    exit 86
  fi
  sleep "$STEP"
  done_s=$((done_s + STEP))
  if [ "$ckpt_now" = 1 ] || { [ "$CKPT" -gt 0 ] && [ $((done_s - last_ckpt)) -ge "$CKPT" ]; }; then
    checkpoint "$done_s"
    last_ckpt=$done_s
    ckpt_now=0
  fi
  if [ "$requeue_now" = 1 ]; then
    echo "fy-train-job $JOB: checkpointed at ${done_s}s on request: requeueing myself"
    "${FY_SCONTROL:-scontrol}" requeue "$JOB"
    exit 0
  fi
done
echo "$WORK $(date +%s) done" > "$PROG.tmp" && mv "$PROG.tmp" "$PROG"
echo "fy-train-job $JOB: done (${WORK}s)"
exit 0
