# trialforge: `make demo` runs the pipeline end to end, `make test` runs the test suite.
# Both set everything up first (system packages when root, the virtualenv, the base sandbox image).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export RAY_USAGE_STATS_ENABLED := 0
export OMP_NUM_THREADS ?= 1

.PHONY: setup system image demo test bench lint lock clean

setup: system $(STAMP) image

system:
	@scripts/setup-system.sh

# The lock pins every package: install it without resolving (fast, reproducible), then check consistency.
$(STAMP): pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip check
	touch $@

image: $(STAMP)
	@$(VENV)/bin/trialforge image build

demo: setup
	$(VENV)/bin/trialforge run

test: setup
	$(PY) -m pytest

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests flows benchmarks
	$(VENV)/bin/ruff format --check src tests flows benchmarks

# Refresh requirements.lock after changing pyproject.toml (resolves once, in a scratch venv).
lock:
	rm -rf .lockenv && python3 -m venv .lockenv
	.lockenv/bin/pip install -q -e '.[dev]'
	.lockenv/bin/pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+cpu$$//' > requirements.lock
	rm -rf .lockenv

clean:
	rm -rf out .trialforge $(VENV)
