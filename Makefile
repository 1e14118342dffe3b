# Two entry points: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test venv lint bench validate clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/dse search search_spaces/quickstart.yaml --out runs/quickstart

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check sim dse astra-sim/astrasim tests experiments

bench: $(STAMP)
	$(BIN)/python experiments/bench_replay.py

validate: $(STAMP)
	$(BIN)/python experiments/validate_vllm.py

clean:
	rm -rf $(VENV) runs .pytest_cache
