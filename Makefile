# Every target creates the virtualenv on first use; nothing else needs installing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test lint typecheck bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The demo needs the package alone (Pykka and structlog), no extra.
$(DEMO_STAMP): $(BIN)/python setup.cfg setup.py pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $(DEMO_STAMP)

$(STAMP): $(BIN)/python setup.cfg setup.py pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

# The peers we compare against (the bench extra: eventsourcing, matplotlib, SQLAlchemy,
# asyncpg, ...) are installed for the benchmarks, and for `typecheck` (so for `test`),
# since `mypy --strict` checks bench/ against the peers it imports.
$(BENCH_STAMP): $(STAMP)
	@echo "make: installing the bench extra into $(VENV): the peers bench/ is type-checked against"
	$(BIN)/python -m pip install --quiet -e '.[test,docs,bench]'
	touch $(BENCH_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/nous-actor demo

lint: $(STAMP)
	$(BIN)/ruff check nous_actor tests bench conftest.py
	$(BIN)/ruff format --check nous_actor tests bench conftest.py

# The benchmarks are type-checked against the peers they import: the bench extra.
typecheck: $(BENCH_STAMP)
	$(BIN)/mypy --strict nous_actor bench

# The session suite runs a second time with every session pinned (a thread of its own),
# the placement `Session.start(..., pinned=True)` gives, beside the shared dispatcher.
PINNED_SUITE := tests/test_session.py tests/test_session_adversarial.py \
	tests/test_session_history.py tests/test_session_machine.py tests/test_session_store.py \
	tests/test_session_fencing.py tests/test_session_runtime.py tests/test_subscription.py \
	tests/test_compaction_loop.py tests/test_registry.py tests/test_append_runs.py

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest --pinned $(PINNED_SUITE)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis site
