# The targets are the commands the README names. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Every extra of the project and every development group, pinned by constraints.txt (make lock).
EXTRAS := relay,postgresql,binary,mysql,async,console
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: help demo test docs lint typecheck unit integration bench chaos soak services clean lock alert-series

help:
	@echo "make demo    run the embedded demo (SQLite + local RabbitMQ)"
	@echo "make test    lint, type-check and run the whole test suite"
	@echo "make docs    build the documentation site into site/ (mkdocs --strict)"
	@echo "make bench   benchmarks: raw pika confirm ceiling vs the relay's drain rate"
	@echo "make chaos   faults at full length (kills, cuts, broker restart, memory alarm): a table"
	@echo "make soak    the relay for 30 minutes at 1,000 msg/s: memory, table size, claim time flat?"
	@echo "make lock    regenerate constraints.txt after changing a dependency in pyproject.toml"
	@echo "make alert-series  record a real relay under faults into the alerts' promtool tests"

$(STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11+ is needed, $(PYTHON) is " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade 'pip>=25.1'
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]' --group dev
	@rm -f $(VENV)/.installed-*
	@touch $@

# constraints.txt: every package `make test` installs, at one version, resolved for Python 3.11 on
# x86-64 Linux, so that every run tests the same versions. Run after changing a dependency in
# pyproject.toml: pins that still fit are kept; `make lock LOCK_ARGS=--upgrade` moves them all to
# the newest versions.
LOCK_ARGS ?=

lock:
	@test -x $(VENV)/bin/uv || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet uv; }
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras --group dev --python-version 3.11 \
		--python-platform x86_64-unknown-linux-gnu --custom-compile-command "make lock" \
		--quiet $(LOCK_ARGS) -o constraints.txt

services:
	@scripts/ensure-services.sh

# About two minutes: real relays under real faults, scraped into tests/prometheus/alerts_test.yaml
# (promtool's unit tests of deploy/prometheus/alerts.yaml). Run after changing an alert or a metric.
alert-series: $(STAMP) services
	$(PY) -m tests.prometheus.record

demo: $(STAMP) services
	$(VENV)/bin/outbox-relay demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(PY) -m mypy

# --strict: a broken link, anchor or snippet fails the build. The theme's notice about its own
# future is not a warning about these pages.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

integration: $(STAMP) services
	$(PY) -m pytest tests/integration tests/e2e -q

# Most tests wait on the broker and the database, not the CPU: several workers overlap the waits.
# Full-speed drains run one at a time on a worker of their own (xdist_group "heavy"), the short
# chaos runs on another ("chaos"): at most two run at once, beside the light tests. Tests that
# change what all of them share (a broker-wide alarm) run alone afterwards.
TEST_WORKERS ?= 4

test: $(STAMP) services lint typecheck docs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	$(PY) -m pytest -q -m serial

# Then the tests too slow for `make test`: a relay with default settings started 30 s before its
# queue exists (tests/integration/test_unroutable_grace.py).
chaos: $(STAMP) services
	$(PY) -m tests.chaos
	OUTBOX_SLOW_TESTS=1 $(PY) -m pytest -q -m "not serial" tests/integration/test_unroutable_grace.py

# SOAK_ARGS="--minutes 5 --every 15" for a shorter run (python -m benchmarks.soak --help).
SOAK_ARGS ?=

soak: $(STAMP) services
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

# Each run also writes its table for the docs' performance page (docs/_generated/).
bench: $(STAMP) services
	$(PY) -m benchmarks --markdown docs/_generated/bench-postgresql.md
	$(PY) -m benchmarks --db mariadb://root@127.0.0.1:3306/test --phases ceiling,in-process,subprocess,enqueue,wakeup \
		--markdown docs/_generated/bench-mariadb.md
	$(PY) -m benchmarks.scale

clean:
	rm -rf $(VENV) site .mypy_cache .ruff_cache .pytest_cache *.egg-info
