# The commands a user needs: `make test` (or `make test-quick`) and `make demo`. All set up `.venv` first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extra pip flags for torch, e.g. PIP_TORCH_FLAGS="--index-url https://download.pytorch.org/whl/cpu"
# on a machine whose package index has no CPU build of torch 2.13.0.
PIP_TORCH_FLAGS ?=

.PHONY: venv test test-quick demo bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints-cpu.txt $(PIP_TORCH_FLAGS) "torch==2.13.0"
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[train,serve,eval,dev]"
	touch $@

test: venv
	$(BIN)/python -m pytest

# Everything but the tests marked slow (they train a tiny model or start an engine).
test-quick: venv
	$(BIN)/python -m pytest -m "not slow"

# DEMO_ARGS: e.g. --quick, --samples, --work-dir DIR (scripts/demo.py --help)
demo: venv
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

bench: venv
	$(BIN)/python bench/registry.py
	$(BIN)/python bench/sft_data.py
	$(BIN)/python bench/train_tiny.py
	$(BIN)/python bench/server.py

clean:
	rm -rf $(VENV) runs .pytest_cache
