# FleetYield developer entry points.
#   make test   unit + integration tests (brings the docker Slurm cluster up if it is not)
#   make up / make down / make demo   the docker Slurm cluster (contrib/slurm-docker-cluster)
#   make lint   ruff + import-linter
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.fleetyield-installed
CLUSTER := contrib/slurm-docker-cluster

.PHONY: venv test unit lint up down demo clean-cluster ab

# (Re)install when pyproject.toml changes (new deps or console scripts).
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/pip || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/pytest

unit: $(STAMP)
	$(VENV)/bin/pytest -m 'not integration'

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

up: $(STAMP)
	$(CLUSTER)/up.sh

down:
	$(CLUSTER)/down.sh

demo: up
	$(CLUSTER)/demo.sh

# down + remove the cluster images and the cached rootfs/wheelhouse (next up is a cold start).
clean-cluster:
	$(CLUSTER)/down.sh --images
	rm -rf $(CLUSTER)/build

# A/B on the docker cluster (`make up` first): bare Slurm vs Slurm + FleetYield on the same chaos timelines.
SEEDS ?= 0,1,2
ab: $(STAMP)
	$(VENV)/bin/fleetyield chaos ab --seeds $(SEEDS) --out chaos-ab
