# Two commands do all the set-up on a fresh machine: `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.trnqwen-installed
PYTEST_ARGS ?=

.PHONY: venv quickstart test test-slow test-all bench docs lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[train,eval,serve,dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## .venv with the trnqwen command in .venv/bin/

quickstart: venv  ## the whole lifecycle on the built-in tiny Qwen3, on this machine
	$(BIN)/trnqwen quickstart

test: venv  ## the test suite a change is checked with (everything not marked slow: 5 min on 2 quiet cores, 25 when busy)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: venv  ## the end-to-end runs (real torchrun/torchtitan, the quickstart, benchmark quick paths; about 45 min in CI)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

test-all: test test-slow  ## both, as CI runs them

bench: venv  ## benchmarks (not part of make test); results in benchmarks/RESULTS.md
	$(BIN)/python benchmarks/run_all.py

docs: venv  ## regenerate docs/cli/*.md and cli/_help_text.py from the CLI's own help
	$(BIN)/python -m trnqwen.cli.docgen docs/cli

lint: venv  ## pyflakes-level checks (unused imports, undefined names)
	$(BIN)/ruff check --select F trnqwen tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache .trnqwen
