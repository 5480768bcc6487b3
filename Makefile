# FleetYield developer entry points.
#   make test   unit + integration tests (brings the docker Slurm cluster up if it is not)
#   make up / make down / make demo   the docker Slurm cluster (contrib/slurm-docker-cluster)
#   make lint   ruff + import-linter + mypy (the decision core)
#   make package   the Debian package, dist/fleetyield_VERSION_ARCH.deb (contrib/deb/build-deb.sh)
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.fleetyield-installed
CLUSTER := contrib/slurm-docker-cluster

.PHONY: venv test unit lint up down test-rest demo clean-cluster ab ab-precursor package sim-frontier sim-noharm ab-gang

# (Re)install when pyproject.toml changes (new deps or console scripts).
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/pip || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/pytest --durations=30  # the 30 slowest in the log: where CI time goes

unit: $(STAMP)
	$(VENV)/bin/pytest -m 'not integration'

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy slurm_fleetyield/core

up: $(STAMP)
	$(CLUSTER)/up.sh

down:
	$(CLUSTER)/down.sh

# The slurmrestd adapter against the cluster's slurmrestd (auth/jwt): its own tests with the closed loop on
# adapter = "rest", then every closed-loop test with the session's controller on adapter = "rest"
# (CI runs the short ones on the CLI adapter; ~6 min). Needs `make up` first.
test-rest: $(STAMP)
	FLEETYIELD_REST_LOOP=1 $(VENV)/bin/pytest -m integration tests/integration/test_slurmrestd.py
	FLEETYIELD_SLURM_ADAPTER=rest $(VENV)/bin/pytest -m integration tests/integration/test_closed_loop.py

demo: up
	$(CLUSTER)/demo.sh

# The .deb: the venv at /opt/fleetyield built with Debian's /usr/bin/python3 (not this venv's), units,
# examples and docs. Needs dpkg-deb; the dependencies come from the package index (or PIP_FIND_LINKS).
package:
	contrib/deb/build-deb.sh dist

# down + remove the cluster images and the cached rootfs/wheelhouse (next up is a cold start).
clean-cluster:
	$(CLUSTER)/down.sh --images
	rm -rf $(CLUSTER)/build

# A/B on the docker cluster (`make up` first; hold /tmp/fy-cluster.lock around it when sharing the cluster):
# bare Slurm vs Slurm + FleetYield on the same chaos timelines, AB_DURATION s each (the 1,800 s profile scaled
# down: work 16-80 s at 240; ~5-6 min per seed and arm), then README's A/B block from docs/ab/ab.json.
SEEDS ?= 0,1,2
AB_DURATION ?= 240
AB_OUT ?= docs/ab
ab: $(STAMP)
	$(VENV)/bin/fleetyield chaos ab --seeds $(SEEDS) --duration $(AB_DURATION) --out $(AB_OUT)
	$(VENV)/bin/fleetyield chaos report $(AB_OUT)/ab.json --readme README.md

# The same timelines (same jobs, same faults) with a share of the faults announced by a visible ECC precursor
# (AB_PRECURSOR_SHARE; simulated like the faults), into README's second A/B block from docs/ab-precursor.
# An emulated admin approves FleetYield's drain proposals AB_ADMIN_DELAY s after they appear (chaos/admin.py):
# 8 s against precursor leads of 24-60 s, about the simulator's 4 h against 12-36 h. Empty: no admin.
AB_PRECURSOR_SHARE ?= 0.5
AB_PRECURSOR_OUT ?= docs/ab-precursor
AB_ADMIN_DELAY ?= 8
ab-precursor: $(STAMP)
	$(VENV)/bin/fleetyield chaos ab --seeds $(SEEDS) --duration $(AB_DURATION) \
		--precursor-share $(AB_PRECURSOR_SHARE) --out $(AB_PRECURSOR_OUT) \
		$(if $(AB_ADMIN_DELAY),--admin-delay $(AB_ADMIN_DELAY))
	$(VENV)/bin/fleetyield chaos report $(AB_PRECURSOR_OUT)/ab.json --readme README.md

# SIMULATED sweeps (no cluster needed; `fleetyield simulate sweep`, tables under docs/sim/).
# Frontier (issue "Where reliability costs"): 2,048 nodes x 30 days, one gang over 15/16 of the fleet,
# baseline vs FleetYield vs oracle, ETTR and net goodput, SIM_SEEDS seeds, precursor shares 0 and 0.25.
SIM_SEEDS ?= 10
SIM_WORKERS ?= 2
sim-frontier: $(STAMP)
	$(VENV)/bin/fleetyield simulate sweep --workload frontier --days 30 --seeds $(SIM_SEEDS) --shares 0,0.25 \
		--policies baseline,fleetyield,oracle --workers $(SIM_WORKERS) --no-plots --out docs/sim/frontier

# Do no harm (issue "Price risk by what it puts at stake"): openb and the synthetic workload, NOHARM_NODES nodes
# x 30 days, node rates NOHARM_RATES x precursor shares NOHARM_SHARES, with the A/A control (baseline_aa:
# unmodified Slurm with another blind node order; its spread is the placement-chaos floor of the comparison:
# at 32 nodes it is wider than the test's -0.1% on the synthetic workload, at 128 it is within it).
NOHARM_RATES ?= 1 3.79 6.5 10 20 30
NOHARM_SHARES ?= 0,0.1,0.25,0.5
NOHARM_LOADS ?= 0.7 0.9
NOHARM_NODES ?= 128
NOHARM_WORKLOADS ?= openb synthetic
NOHARM_OUT ?= docs/sim/noharm$(NOHARM_NODES)
sim-noharm: $(STAMP)
	for w in $(NOHARM_WORKLOADS); do for l in $(NOHARM_LOADS); do for r in $(NOHARM_RATES); do \
		$(VENV)/bin/fleetyield simulate sweep --workload $$w --load $$l --nodes $(NOHARM_NODES) --days 30 \
			--seeds $(SIM_SEEDS) --node-rate $$r --shares $(NOHARM_SHARES) \
			--policies baseline,baseline_aa,fleetyield,oracle --workers $(SIM_WORKERS) \
			--no-plots --out $(NOHARM_OUT)/$$w-load$$l-rate$$r || exit 1; done; done; done
	$(VENV)/bin/python bench/noharm_table.py $(NOHARM_OUT) > $(NOHARM_OUT)/table.md

# A 3-node gang and one fatal GPU fault per seed (chaos/gang_ab.py), bare Slurm (hang until the collective
# timeout, NHC drain, requeue after the failure) vs Slurm + FleetYield (pushed XID: drain and requeue at once),
# then README's gang block from docs/ab-gang/ab-gang.json. `make up` first; hold /tmp/fy-cluster.lock around
# it when sharing the cluster. ~7 min per seed (both arms).
GANG_SEEDS ?= 0,1,2
GANG_OUT ?= docs/ab-gang
ab-gang: $(STAMP)
	$(VENV)/bin/fleetyield chaos ab-gang --seeds $(GANG_SEEDS) --out $(GANG_OUT)
	$(VENV)/bin/fleetyield chaos report $(GANG_OUT)/ab-gang.json --readme README.md
