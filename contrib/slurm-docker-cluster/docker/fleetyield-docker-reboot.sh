#!/bin/bash
# fleetyield-docker-reboot: slurm.conf RebootProgram of the docker test cluster -- the docker stand-in
# for a real node reboot (installed as /opt/fleetyield/bin/fleetyield-docker-reboot).
#
# `scontrol reboot [Reason=...] <node>` makes slurmctld send REBOOT_NODES to the node's slurmd, which runs
# RebootProgram (synchronously, as root).  A container cannot reboot its kernel, so this "reboots" the
# container instead, honestly enough for FleetYield's remediation ladder:
#   1. it leaves a marker (/var/spool/fleetyield-reboot/requested) and returns at once (slurmd is waiting);
#   2. a moment later it stops slurmd: slurmd is the container's main process, so the container exits and
#      docker's restart policy (unless-stopped) starts it again -- every process of the "node" restarts
#      (slurmd, the node agent), like after a real reboot;
#   3. the entrypoint sees the marker at start ("booting after a reboot"): it power-cycles every fake GPU
#      before the agent starts (`fleetyield-agent reset --gpu N` for all GPUs: what a power-on does to a
#      GPU) and starts slurmd with `-b`.
#
# Why `slurmd -b`: slurmctld only considers a REBOOT_ISSUED node rebooted when it registers with a boot
# time newer than the reboot request.  slurmd derives the boot time from the kernel's uptime, and a
# container shares the host's kernel, so without -b the boot time never changes: slurmctld keeps the node
# DOWN+DRAIN+REBOOT_ISSUED until ResumeTimeout and then (22.05.8, measured) puts it back with the DRAIN
# CLEARED -- our reason gone, exactly what the lifecycle must never see.  `-b` ("report node rebooted when
# daemon restarted") makes slurmd report its own start as the boot time; it is only used on the start that
# follows this program, so an ordinary container restart is not mistaken for a reboot.
#
# Measured on 22.05.8: IDLE+DRAIN -> DOWN+DRAIN+REBOOT_ISSUED -> IDLE+DRAIN in ~4 s; DRAIN and the reason
# survive (slurmctld appends " : reboot issued" to it); slurmctld logs "node X returned to service" but the
# node stays drained until FleetYield resumes it itself (CANARY entry).
#
# Reboot vs GPU reset on the fake backend: both clear the faults a reset can fix (the fake backend's
# reset_fixes; XID 79 included -- NVIDIA's catalog says RESTART_BM for it, so FleetYield's ladder never
# tries a plain GPU reset for XID 79 and goes straight to this reboot); a reboot resets EVERY GPU and
# restarts the node's software (slurmd, the agent: a fresh process, fresh volatile counters).  What a
# reset cannot fix survives a reboot too, as bad silicon would: quiet corruption (`fault corrupt`),
# XID 64, and any fault injected with --no-reset-fixes.
set -uo pipefail
MARKER_DIR=/var/spool/fleetyield-reboot
LOG=/var/log/fleetyield/reboot.log
mkdir -p "$MARKER_DIR" "$(dirname "$LOG")"
echo "$(date +%s.%N) reboot requested by slurmd (RebootProgram); args: $*" >>"$LOG"
date +%s.%N >"$MARKER_DIR/requested"
# Detach: slurmd waits for this program; stop slurmd only once it has its answer.
(
  sleep 0.5
  pid=$(cat /run/slurmd.pid 2>/dev/null || true)
  echo "$(date +%s.%N) stopping slurmd (pid ${pid:-?}): the container restarts" >>"$LOG"
  [[ -n $pid ]] || exit 0
  kill -TERM "$pid"
  # A real reboot is unconditional: slurmd may hang in its shutdown (e.g. retrying a prolog-complete RPC
  # for 15 s at a time); SIGKILL it after 5 s.
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
  echo "$(date +%s.%N) slurmd did not stop in 5 s: SIGKILL" >>"$LOG"
  kill -KILL "$pid"
) </dev/null >/dev/null 2>&1 &
exit 0
