# h3batch — every target sets itself up; `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo serve test test-fast bench clean

setup: $(STAMP)

# Re-runs only when the dependency list changes. torch==2.13.0 resolves to the CPU wheel on this disk.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (h3batch needs Python 3.11)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/h3batch demo

serve: setup
	$(VENV)/bin/h3batch serve

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/api_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache out build *.egg-info

# Fault injection at full size (docs/reliability.md): 20 worker kills over 20 jobs, Redis restarts with 50 queued
# jobs (clean, kill -9 with fsync always and everysec). About 10 min on 2 CPU cores; `make test` runs the small cases.
.PHONY: test-chaos
test-chaos: setup
	H3BATCH_CHAOS=1 $(PY) -m pytest -q -s -m chaos tests/system

# Soak (docs/reliability.md "Round two"): SOAK_JOBS (default 300) jobs through `h3batch serve` with random worker
# kill -9, API kill -9 and Redis restarts; prints one JSON line of lost/duplicated/stuck/5xx/RSS/disk figures.
.PHONY: test-soak
test-soak: setup
	H3BATCH_SOAK=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/system/test_soak.py

# `docker compose up` for real (docs/deploy.md "Tested"): Docker or podman with a compose that reads the file, the base
# image from Debian's packages when no registry answers, the images from the lock, then the CPU stack: one job, a
# batch of 3, the reference sweep, a worker container killed mid-render, `compose down -v`. Not in `make test`.
.PHONY: test-compose
test-compose: setup
	docker/compose-host.sh
	H3BATCH_COMPOSE=1 $(PY) -P -m pytest -q -s -p no:cacheprovider tests/system/test_compose_stack.py
