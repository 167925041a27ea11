VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test bench venv tck chromium screenshots interop docs

# Create or refresh the virtual environment whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/taskgrove serve

# The dashboard's browser tests drive Debian's chromium (never a browser downloaded by Playwright):
# installed here when missing, so `make test` works on a fresh machine (root, as on CI).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

chromium: $(CHROMIUM)

# Three workers on two cores: about half of the suite's time is waiting (7 min 49 s with two, 6 min
# 47 s with three, 6 min 9 s with four). The extra load makes instances with 2-second leases lose
# them now and then, which the fault tests must survive (bench/README.md, twelfth round: two bugs
# that load found, both fixed).
test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -n 3 --dist loadgroup $(PYTEST_ARGS)

# The dashboard page's screenshots (docs/screenshots/*.png), taken with the same tooling as the browser tests.
screenshots: $(STAMP) $(CHROMIUM)
	$(PY) docs/screenshots.py

# The manual as a static site (mkdocs.yml): the pages of docs/ with README.md as the home page, built
# into site/. --strict turns every warning (a link to a missing page or anchor) into a failure.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict

# Over the real wire: a `taskgrove serve` process, wrk and a bare Starlette ceiling (bench/README.md);
# bench/run.py (in-process) stays as a profiling aid.
bench: $(STAMP)
	$(PY) bench/wire.py $(BENCH_ARGS)

# Both A2A TCK branches (../shared/a2a-tck) against a real `taskgrove serve` with the fake LLM;
# fails on any failure or error not listed in .ci/tck-expected.txt (docs/tck.md).
tck: $(STAMP)
	$(PY) .ci/tck.py $(TCK_ARGS)

# Third-party A2A clients and servers (Google ADK, pydantic-ai, the official a2a-sdk client,
# a2a-lint) against a real `taskgrove serve` (interop/README.md). Each package gets its own venv
# under .interop/, pinned in interop/pins/NAME.txt and rebuilt when that file changes.
INTEROP_ENVS := adk pydantic sdk lint
.interop/%/.installed: interop/pins/%.txt
	rm -rf .interop/$*
	python3 -m venv .interop/$*
	.interop/$*/bin/python -m pip install -q --upgrade pip
	.interop/$*/bin/python -m pip install -q -r $<
	touch $@

interop: $(STAMP) $(foreach env,$(INTEROP_ENVS),.interop/$(env)/.installed)
	$(PY) interop/run.py
