# trialforge: `make demo` runs the pipeline end to end, `make test` runs the test suite.
# Both set everything up first (system packages when root, the virtualenv, the base sandbox image).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The MLflow tracking server (`trialforge tracking ui`, tests/test_tracking.py) has a venv of its own: the full
# mlflow pins pyarrow<26, the project pyarrow 26; the project's venv holds the client alone (mlflow-skinny).
MLFLOW_VENV ?= .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export RAY_USAGE_STATS_ENABLED := 0
export OMP_NUM_THREADS ?= 1

.PHONY: setup system image demo test test-fast bench lint lock lock-mlflow clean

# After the system packages: the two venvs side by side (each is mostly one process, unpacking and compiling), then
# the image, once the main venv is there.
setup: system
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(MLFLOW_STAMP) image
	@echo "set up. The commands of README.md run in the virtualenv: source $(VENV)/bin/activate"

system:
	@scripts/setup-system.sh

# The lock pins every package: install it without resolving (fast, reproducible), then check consistency.
$(STAMP): pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip check
	touch $@

# Like the main venv: its lock installed without resolving (~2 min once; compiled, so the server starts in ~10 s).
$(MLFLOW_STAMP): requirements-mlflow.lock
	python3 -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install -q --no-deps -r requirements-mlflow.lock
	$(MLFLOW_VENV)/bin/python -m pip check
	touch $@

# Old releases of test tooling a test installs into an image (tests/fixtures/old-test-tools.txt): fetched here, by
# hash, so the suite itself sends nothing past loopback.
TEST_WHEELS := .cache/test-wheels
$(TEST_WHEELS)/.fetched: tests/fixtures/old-test-tools.txt $(STAMP)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --require-hashes -d $(TEST_WHEELS) -r $<
	touch $@

image: $(STAMP)
	@$(VENV)/bin/trialforge image build

demo: setup
	$(VENV)/bin/trialforge run

# On two pytest-xdist workers: the suite mostly waits (servers, sandboxes), so two overlap (docs/testing.md).
TEST_WORKERS ?= 2
test: setup $(TEST_WHEELS)/.fetched
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The loop while working: every test that starts no server and takes no minutes (docs/testing.md). `make test`
# (and CI) still runs them all.
test-fast: setup
	$(PY) -m pytest -m "not services and not slow"

# realrepos.py needs repositories: `make bench REPOS="--corpus tuning"` (or "--repo NAME=PATH ...") runs it too
# (docs/realrepos.md); synthesis_realrepos.py needs the corpus's mirrors: `make bench MIRRORS=DIR` (docs/synthesis.md).
bench: setup
	@for b in benchmarks/*.py; do case $$b in benchmarks/realrepos.py|benchmarks/synthesis_realrepos.py) continue;; esac; \
		echo "== $$b"; $(PY) $$b || exit 1; done
	@if [ -n "$(REPOS)" ]; then echo "== benchmarks/realrepos.py"; $(PY) benchmarks/realrepos.py $(REPOS); fi
	@if [ -n "$(MIRRORS)" ]; then echo "== benchmarks/synthesis_realrepos.py"; \
		$(PY) benchmarks/synthesis_realrepos.py --mirrors $(MIRRORS); fi

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests flows benchmarks
	$(VENV)/bin/ruff format --check src tests flows benchmarks
	$(VENV)/bin/lint-imports --no-cache

# Refresh requirements.lock after changing pyproject.toml (resolves once, in a scratch venv).
lock:
	rm -rf .lockenv && python3 -m venv .lockenv
	.lockenv/bin/pip install -q -e '.[dev]'
	.lockenv/bin/pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+cpu$$//' > requirements.lock
	rm -rf .lockenv

# Refresh requirements-mlflow.lock: the full mlflow at the version of the client pinned in pyproject.toml.
lock-mlflow:
	rm -rf .lockenv-mlflow && python3 -m venv .lockenv-mlflow
	.lockenv-mlflow/bin/pip install -q "mlflow==$$(sed -n 's/.*"mlflow-skinny==\([^"]*\)".*/\1/p' pyproject.toml)"
	(echo "# The MLflow tracking server's venv ($(MLFLOW_VENV)): make lock-mlflow refreshes it."; \
	 .lockenv-mlflow/bin/pip freeze --all | grep -v '^pip==') > requirements-mlflow.lock
	rm -rf .lockenv-mlflow

clean:
	rm -rf out .trialforge .cache $(VENV) $(MLFLOW_VENV)
