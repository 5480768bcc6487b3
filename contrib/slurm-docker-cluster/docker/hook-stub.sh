#!/bin/sh
# Placeholder installed by the Dockerfile when the FleetYield prolog/epilog
# (prolog_epilog.prolog / prolog_epilog.epilog) is not part of the installed wheel yet.
# It lets every job through, and says so in the slurmd log.
echo "fleetyield: $(basename "$0") placeholder (prolog_epilog not installed); job ${SLURM_JOB_ID:-?} allowed" >&2
exit 0
