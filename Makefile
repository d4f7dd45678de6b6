# The two commands a newcomer needs: `make demo` and `make test`.
# Both build a pinned virtualenv under .venv first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck soak chaos mutate bench clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/replayq demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -m "not soak" -p no:cacheprovider

# Minutes-long SIGKILL loops on both backends (REPLAYQ_SOAK_SECONDS per backend, default 300).
soak: $(STAMP)
	$(BIN)/pytest -m soak -p no:cacheprovider -s

# The fault tests on both backends; each prints the chaos checker's table (tests/chaos_check.py).
chaos: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -s tests/acceptance/test_postgres_chaos.py \
		tests/acceptance/test_sqlite_faults.py tests/acceptance/test_postgres_read_only.py

# Plant each named bug of scripts/mutate.py in a copy of the tree; exit 1 if one survives.
mutate: $(STAMP)
	$(BIN)/python scripts/mutate.py

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -r benchmarks/requirements.txt
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/context_overhead.py
	$(BIN)/python benchmarks/replay_speed.py
	$(BIN)/python benchmarks/seal_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
