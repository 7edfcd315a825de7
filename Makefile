# The whole set-up: `make demo` runs the main job, `make test` runs lint, types and tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint types unit browser bench clean

# torch is installed first and pinned, so that nothing pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job on the embedded models; re-running resumes (rm -rf demo-out to start over).
demo: $(STAMP)
	$(VENV)/bin/renderq run src/renderq/examples/shapes-200.txt --out demo-out

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

types: $(STAMP)
	$(VENV)/bin/mypy

# The dashboard and review page tests drive a real headless Chromium (Debian's packages;
# the review page's through Selenium and chromium-driver).
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
		[ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
		>/dev/null; } || echo "chromium or chromium-driver is not installed: the browser tests will be skipped"

unit: $(STAMP) browser
	$(VENV)/bin/pytest -q

test: lint types unit

bench: $(STAMP)
	$(PY) benchmarks/scheduler_overhead.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
