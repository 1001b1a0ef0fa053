# h3batch — every target sets itself up; `make demo` and `make test` work on a fresh machine.
# The environment is installed from the lock (requirements/cpu.lock), never resolved afresh: docs/development.md.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
LOCK   ?= requirements/cpu.lock
# Python's safe-path mode: no checkout folder (kernels/, worker/, ...) can shadow an installed distribution.
RUN    := $(PY) -P
UV_VERSION := 0.13.9
TOOLS  := .venv-tools

.PHONY: setup demo serve test test-fast test-latest lock bench clean

setup: $(STAMP)

# Exactly the lock: every package pinned with its hashes, no dependency resolution (--no-deps), then the project
# itself (editable, no build isolation, so its build backend is the locked setuptools). Re-runs when the lock moves.
$(STAMP): $(LOCK) pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (h3batch needs Python 3.11)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $(STAMP)

# Refresh the locks on purpose (docs/development.md): one set for CPU machines (CPU torch, from this machine kind's
# /opt/wheels) and one that resolves for CUDA machines (PyPI's CUDA torch), both for Python 3.11 on Linux x86_64.
# `make lock UPGRADE=--upgrade` takes the newest releases pyproject allows; `UPGRADE="--upgrade-package NAME"` one.
UPGRADE ?=
UV := $(TOOLS)/bin/uv
LOCK_ARGS := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --quiet $(UPGRADE)
$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
lock: $(UV)
	$(UV) pip compile pyproject.toml --extra test $(LOCK_ARGS) --find-links /opt/wheels \
		-c requirements/cpu.constraints -o requirements/cpu.lock
	$(UV) pip compile pyproject.toml $(LOCK_ARGS) -c requirements/cuda.constraints -o requirements/cuda.lock
	# The images' lists (docker/Dockerfile, docs/deploy.md "Images"): subsets of the CPU lock, same pins and hashes.
	for image in api loadrunner build; do \
		$(UV) pip compile docker/requirements/$$image.in $(LOCK_ARGS) -c requirements/cpu.lock \
			-o docker/requirements/$$image.txt || exit 1; \
	done
	$(UV) pip compile pyproject.toml $(LOCK_ARGS) --find-links /opt/wheels -c requirements/cpu.lock \
		-o docker/requirements/worker-cpu.txt

demo: setup
	$(VENV)/bin/h3batch demo

serve: setup
	$(VENV)/bin/h3batch serve

test: setup
	$(RUN) -m pytest -q

# The suite without the whole-stack system tests and the browser: about a third of `make test`'s time.
test-fast: setup
	$(RUN) -m pytest -q --ignore=tests/system -m "not slow and not chaos"

# The newest releases pyproject allows, no lock: a second venv resolved today, running the fast suite, so an upstream
# break is seen before users see it (docs/development.md records the last run).
LATEST := .venv-latest
test-latest:
	rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools
	$(LATEST)/bin/python -m pip install -q --disable-pip-version-check --upgrade --upgrade-strategy eager -e ".[test]"
	$(LATEST)/bin/python -m pip freeze --exclude-editable > $(LATEST)/resolved.txt
	$(LATEST)/bin/python -P -m pytest -q -p no:cacheprovider --ignore=tests/system -m "not slow and not chaos"

bench: setup
	$(RUN) bench/api_overhead.py

clean:
	rm -rf $(VENV) $(TOOLS) $(LATEST) .pytest_cache out build *.egg-info

# Fault injection at full size (docs/reliability.md): 20 worker kills over 20 jobs, Redis restarts with 50 queued
# jobs (clean, kill -9 with fsync always and everysec). About 10 min on 2 CPU cores; `make test` runs the small cases.
.PHONY: test-chaos
test-chaos: setup
	H3BATCH_CHAOS=1 $(RUN) -m pytest -q -s -m chaos tests/system

# Soak (docs/reliability.md "Round two", "Round three"): SOAK_JOBS (default 300) jobs and SOAK_BATCHES batches (default
# SOAK_JOBS/25, of SOAK_BATCH_ITEMS=5; kept, cancelled, deleted, cancel racing delete) through `h3batch serve` with
# random worker kill -9, API kill -9 and Redis restarts; prints one JSON line of lost/duplicated/stuck/5xx/archive
# member/RSS/disk figures.
.PHONY: test-soak
test-soak: setup
	H3BATCH_SOAK=1 $(RUN) -m pytest -q -s -p no:cacheprovider tests/system/test_soak.py

# `docker compose up` for real (docs/deploy.md "Tested"): Docker or podman with a compose that reads the file, the base
# image from Debian's packages when no registry answers, the images from the lock, then the CPU stack: one job, a
# batch of 3, the reference sweep, a worker container killed mid-render, `compose down -v`. Not in `make test`.
.PHONY: test-compose
test-compose: setup
	docker/compose-host.sh
	H3BATCH_COMPOSE=1 $(RUN) -m pytest -q -s -p no:cacheprovider tests/system/test_compose_stack.py
