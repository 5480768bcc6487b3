#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run (what was run on the H200 recorded in bench/README.md).
# Usage, on a GPU machine, from the repository root: bash bench/gpu_checks.sh [OUTDIR]
# Needs the NVIDIA driver and python3 with this package's dependencies (or wheels of them in .whl/, which
# are installed into /tmp/site first: the GPU machine here has no package index). PyTorch, where present,
# puts a matrix-product load on GPU 0 so the probe can show the fields are live.
set -u
OUTDIR=${1:-${OUT:-/tmp/fy-gpu-checks}}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/log.txt") 2>&1
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
agent() { python3 -c "from node_agent.cli import main; main()" "$@"; }
step() { echo; echo "=== $* ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,vbios_version,ecc.mode.current,persistence_mode,mig.mode.current --format=csv
python3 -c "import sys, pynvml, pydantic, cryptography; print(sys.version.split()[0], 'pynvml', pynvml.__file__, 'pydantic', pydantic.VERSION, 'cryptography', cryptography.__version__)"

step "tests that need a GPU (and the nvml unit tests)"
python3 -m pytest -q -p no:cacheprovider -rs tests/node_agent/test_nvml_gpu.py tests/node_agent/test_nvml.py tests/node_agent/test_cuda_check.py tests/attest/test_cuda_scrub.py

step "probe: fields, sample() cost, exposition -> controller tick, idle vs load"
python3 -c "from node_agent.cli import main; main()" metrics --backend nvml --state-dir "$(mktemp -d)" > "$OUTDIR/agent_metrics.txt"; echo "agent metrics rc $?"
python3 bench/bench_nvml.py --samples 300 --load-seconds 10 --json "$OUTDIR/nvml_probe.json" --exposition "$OUTDIR/metrics.txt" > /dev/null
python3 - "$OUTDIR/nvml_probe.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("driver", "gpus", "xid_thread_alive", "fields_absent", "sample_ms", "refresh_slow_ms", "exposition", "controller"):
    print(k, "=", json.dumps(d.get(k), sort_keys=True))
ld = d.get("load", {})
print("load rc", ld.get("rc"), "matmuls", ld.get("matmuls"), "samples", ld.get("samples"), "util>50", ld.get("samples_util_over_50"))
print("idle", json.dumps(ld.get("idle"), sort_keys=True))
print("peak", json.dumps(ld.get("peak"), sort_keys=True))
print("energy_delta_mj", ld.get("energy_delta_mj"), ld.get("stderr_tail", "")[-200:])
EOF

step "agent serve --backend nvml: HTTP scrape latency and RSS"
python3 bench/bench_agent.py --backend nvml --scrapes 300

step "metrics CLI (first lines) and a signed quote measured through NVML"
ST=$(mktemp -d)
agent metrics --backend nvml --state-dir "$ST" | grep -E '^DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_TOTAL)' | head -3
agent quote --backend nvml --state-dir "$ST" --nonce "$(python3 -c 'import secrets; print(secrets.token_hex(32))')" > "$OUTDIR/quote.json"
echo "quote rc $?"; python3 -c "import json,sys; q=json.load(open(sys.argv[1])); print(sorted(q)); print(json.dumps([r for r in q.get('records', []) if 'gpu' in json.dumps(r).lower()][:4], default=str)[:2000])" "$OUTDIR/quote.json"

step "scrub: CLI on the whole free memory, twice; then the hand-over's scrub through attest.scrub_command"
agent attest scrub-gpu; echo "rc $?"
agent attest scrub-gpu --chunk-mib 4096; echo "rc $?"
python3 - <<'EOF'
import sys, time
from pathlib import Path
from types import SimpleNamespace
from node_agent.attest.config import AttestConfig
from node_agent.attest.service import Attestor
from node_agent.backends.nvml import NvmlBackend
b = NvmlBackend("gpu-node"); b.start()
cmd = [sys.executable, "-c", "from node_agent.cli import main; main()", "attest", "scrub-gpu", "--pci-bus-id", "{pci}"]
agent = SimpleNamespace(backend=b, state_dir=Path("/tmp"), node="gpu-node", clock=time.time)
t0 = time.perf_counter(); done = Attestor(agent, AttestConfig(scrub_command=cmd)).scrub(None)
print("hand-over scrub", done, f"{time.perf_counter() - t0:.2f} s"); b.stop()
EOF
step "active check on real GPUs: the PTX known-answer kernel per GPU (+ dcgmi diag -r 1 where installed)"
CK=$(mktemp -d)
agent check --backend nvml --state-dir "$CK" --json > "$OUTDIR/check.json"; echo "check rc $? (0 pass, 1 fail, 3 no compute path)"
cat "$OUTDIR/check.json"
agent check --backend nvml --state-dir "$CK"; echo "check (text) rc $?"
python3 - <<'EOF'
import time
from node_agent.cuda_check import run_cuda_check
from node_agent.backends.nvml import NvmlBackend
b = NvmlBackend("gpu-node"); b.start()
for _ in range(3):
    t0 = time.perf_counter(); r = run_cuda_check("gpu-node", b.infos(), time.time())
    print("cuda check", r.ok, [x.detail for x in r.results], f"{(time.perf_counter() - t0) * 1000:.0f} ms end to end")
b.stop()
EOF

step "NVML call cost inside one sample(), the field-value API for the slow counters, RSS by stage"
python3 bench/bench_nvml_calls.py --reps 100

step "done"
