# `make demo` and `make test` are the whole set-up on a fresh machine:
# each creates .venv when it is absent and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Each device count runs in a pytest process of its own: logical CPUs are fixed
# once per process, and MirroredStrategy instances of different sizes in one
# process break each other's collective all-reduce.
TEST_DEVICE_COUNTS := 1 2 3 4
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	@status=0; for n in $(TEST_DEVICE_COUNTS); do \
	  echo "== pytest session with $$n logical CPU(s) =="; \
	  $(PY) -m pytest tests --logical-cpus=$$n $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then status=$$rc; fi; \
	done; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info
