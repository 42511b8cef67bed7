# `make demo` and `make test` are the whole set-up on a fresh machine:
# each creates .venv when it is absent and installs the project into it.
PYTHON ?= python3
NIGHTLY ?= 3.16.0.dev2026102704
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Logical CPUs are fixed once per process, and MirroredStrategy objects in one
# process clash in their collective all-reduce (different sizes: "joining a
# group with size 4, but that group has size 2"; same size: "Shape mismatch in
# the collective instance"). So unmarked tests share one process, and each test
# file marked logical_cpus(N) runs in a process of its own for each such N;
# the first process fails, naming the file, for an N not listed here.
TEST_DEVICE_COUNTS := 2 3 4
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-versions clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	@status=0; failed=""; \
	run() { $(PY) -m pytest "$$@" $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then status=$$rc; failed="$$failed $$1($$2)"; fi; }; \
	echo "== tests on 1 device =="; run tests --logical-cpus=1 --device-counts="$(TEST_DEVICE_COUNTS)"; \
	for n in $(TEST_DEVICE_COUNTS); do \
	  for file in $$(grep -rl --include='test_*.py' "logical_cpus($$n)" tests | sort); do \
	    echo "== $$file on $$n logical CPUs =="; run "$$file" --logical-cpus=$$n -q; \
	  done; \
	done; \
	if [ $$status -eq 0 ]; then echo "make test: every session passed"; \
	else echo "make test: failed sessions:$$failed"; fi; exit $$status

# The tests that touch Keras and TensorFlow internals, on every supported
# Keras/TensorFlow pair (cached venvs under .venv-versions/).
# NIGHTLY=latest tries the newest keras-nightly instead of the pinned build.
test-versions:
	NIGHTLY=$(NIGHTLY) PYTHON=$(PYTHON) bash .ci/test-versions

clean:
	rm -rf $(VENV) .venv-versions build *.egg-info
