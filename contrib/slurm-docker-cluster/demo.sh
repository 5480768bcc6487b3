#!/usr/bin/env bash
# A short tour of the running cluster (make demo runs up.sh first).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
pick_docker || die "docker daemon not reachable; run up.sh"
x() { echo; echo "\$ $*"; "$DOCKER" exec slurmctld "$@"; }

x sinfo -N -l
echo; echo "\$ scontrol show node -o | GRES/features"
"$DOCKER" exec slurmctld scontrol show node -o \
  | sed -E 's/^NodeName=([^ ]+).* AvailableFeatures=([^ ]+).* Gres=([^ ]+).* State=([^ ]+).*/\1  gres=\3  features=\2  state=\4/'
echo; echo "\$ sbatch --gres=gpu:2 --wrap '...'"
job=$("$DOCKER" exec slurmctld sbatch --parsable --gres=gpu:2 -o '/shared/demo-%j.out' \
  --wrap 'echo "job $SLURM_JOB_ID on $(hostname): CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"')
echo "submitted job $job"
deadline=$((SECONDS + 120))
until [[ $("$DOCKER" exec slurmctld squeue -h -j "$job" 2>/dev/null) == "" ]]; do
  ((SECONDS < deadline)) || die "job $job did not finish in 120 s"
  sleep 0.5
done
x cat "/shared/demo-$job.out"
x sacct -j "$job" -X -o JobID,JobName,State,NodeList,AllocTRES%50
echo; echo "\$ curl -s http://gpu-h100-1:9400/metrics | sed -n 1,20p   (from slurmctld)"
"$DOCKER" exec slurmctld curl -fsS --max-time 5 http://gpu-h100-1:9400/metrics | sed -n 1,20p \
  || echo "(agent not answering: is node_agent installed in the image?)"
