# `make demo` and `make test` are the whole set-up on a fresh machine:
# each creates .venv when it is absent and installs the project into it.
# PYTHON: the interpreter .venv is made from; an optimised build (profile-guided,
# libpython linked in) runs the suite faster (docs/contributing.md).
PYTHON ?= python3
NIGHTLY ?= 3.16.0.dev2026102704
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Device counts of the tests marked logical_cpus(N): tests/run_sessions.py
# runs the files marked with each N in a process split into N logical CPUs,
# beside the tests on one device, and fails, naming the file, on an N not
# listed here (a test that needs 3 replicas uses 3 of the 4). TEST_JOBS:
# the most processes of one session (default: the number of cores).
TEST_DEVICE_COUNTS := 2 4
TEST_JOBS ?=
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-versions test-browser test-cluster lint docs docs-serve dist-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) tests/run_sessions.py --device-counts "$(TEST_DEVICE_COUNTS)" \
	  $(if $(TEST_JOBS),--jobs $(TEST_JOBS)) $(PYTEST_ARGS)

# The tests that touch Keras and TensorFlow internals, on every supported
# Keras/TensorFlow pair (cached venvs under .venv-versions/).
# NIGHTLY=latest tries the newest keras-nightly instead of the pinned build.
test-versions:
	NIGHTLY=$(NIGHTLY) PYTHON=$(PYTHON) bash .ci/test-versions

# Tools for lint, docs and dist-check, each an extra of the project, each with
# a stamp of its own so that `make test` installs none of them.
$(VENV)/.installed-%: pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[$*]'
	touch $@

# ruff, as configured in pyproject.toml: the lint rules and the format check;
# then mypy over the package (pyproject.toml's [tool.mypy]).
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site, built with --strict (a broken link or reference
# fails), then every Python and shell block of docs/ run in order, page by page.
docs: $(VENV)/.installed-docs
	$(VENV)/bin/mkdocs build --strict --site-dir build/site
	KERAS_SCALING_DOCS_EXAMPLES=1 $(PY) -m pytest tests/test_docs.py $(PYTEST_ARGS)

docs-serve: $(VENV)/.installed-docs
	$(VENV)/bin/mkdocs serve

# The wheel and the sdist, twine check, and a smoke test of the wheel in a
# fresh venv that already has tensorflow-cpu.
dist-check: $(VENV)/.installed-dist
	PY=$(abspath $(PY)) PYTHON=$(PYTHON) bash .ci/dist-check

# TensorBoard in a real browser: Debian's chromium, driven by Playwright,
# over the logs of a short run and a short bench sweep (not part of `make test`).
test-browser: $(VENV)/.installed-browser
	bash .ci/install-chromium
	$(PY) -m pytest tests/browser $(PYTEST_ARGS)

# Training on the cluster engines people run, on this machine only: a
# throw-away single-node Slurm cluster on 127.0.0.1 (Debian's slurmctld,
# slurmd, slurm-client and munge, installed when absent), started for the
# run and stopped by PID whatever happens (not part of `make test`).
test-cluster: $(VENV)/.installed-cluster
	bash .ci/install-slurm
	$(PY) -m pytest tests/cluster $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-versions build dist site *.egg-info
