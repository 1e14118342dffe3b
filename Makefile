# Two entry points: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3.11
VENV   ?= .venv
# Optional extras the test suite exercises: aiconfigurator's per-op database (x86-64
# wheels only, ~114 MB) and CPU PyTorch for the profiler test. Set to empty to skip.
AIC_EXTRA   ?= $(if $(filter x86_64,$(shell uname -m)),aic,)
TORCH_SPEC  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

comma := ,

.PHONY: demo test venv lint bench validate clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test$(if $(AIC_EXTRA),$(comma)$(AIC_EXTRA),)]'
	$(if $(TORCH_SPEC),$(BIN)/python -m pip install --quiet '$(TORCH_SPEC)',)
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
