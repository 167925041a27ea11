VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test bench venv tck

# Create or refresh the virtual environment whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/taskgrove serve

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Over the real wire: a `taskgrove serve` process, wrk and a bare Starlette ceiling (bench/README.md);
# bench/run.py (in-process) stays as a profiling aid.
bench: $(STAMP)
	$(PY) bench/wire.py $(BENCH_ARGS)

# Both A2A TCK branches (../shared/a2a-tck) against a real `taskgrove serve` with the fake LLM;
# fails on any failure or error not listed in .ci/tck-expected.txt (README, "A2A TCK").
tck: $(STAMP)
	$(PY) .ci/tck.py $(TCK_ARGS)
