#!/usr/bin/env bash
# The CPU engine for the virtual API server, on 127.0.0.1: llama.cpp's OpenAI-compatible server when it is
# installed (`make engine`) and the model has a GGUF, else `transformers serve` of the folder.
#
#   scripts/serve_engine_cpu.sh runs/demo/latest/simulator [PORT]     # PORT defaults to 12345
#   python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml --model "$PWD/runs/demo/latest/simulator"
#
# Either way the model name clients send is the folder's absolute path as typed, links kept ("$PWD/MODEL_DIR"
# for a relative MODEL_DIR), printed below. ENGINE=transformers (or llama.cpp) forces one engine.
#
# llama.cpp (bench/engines.py measured it against `transformers serve` on SmolLM2-135M):
# - the GGUF: a base model's own (`mirrorapi models get` keeps the original); a fine-tune of one is exported
#   once into its folder (`mirrorapi models gguf DIR`, f16). Other folders (the tiny test model, whose
#   tokenizer has no GGUF) are served by transformers.
# - `python -m mirrorapi.llama_cpp_engine`: llama-cpp-python's server, enforcing OpenAI's `response_format`
#   json_schema with a grammar, one request at a time (concurrent ones queue), all cores.
# `transformers serve` (../shared/notes/engines.md):
# - answers only requests whose `model` is the string it was started with (else HTTP 400 "Server is pinned
#   to ..."); the folder is preloaded (FORCE_MODEL argument) and never reloaded; `--device cpu`.
# - `GET /v1/models` answers 500 unless the hub cache folder exists: an empty one of this checkout's, made
#   once and reused (runs/.engine-hub-cache; a folder per start would outlive the engine, which replaces
#   this shell), so it lists no model of the user's own hub cache.
# - no model hub is reached (HF_HUB_OFFLINE=1); `response_format` is accepted but not enforced.
set -euo pipefail
if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: $0 MODEL_DIR [PORT]   (MODEL_DIR: a model folder, e.g. runs/demo/latest/simulator)" >&2
    exit 2
fi
MODEL_DIR="$(cd "$1" && pwd -L)"  # logical: runs/demo/latest stays a link, as clients type it
if [[ ! -f "$MODEL_DIR/config.json" ]]; then  # neither engine serves it: one line, not transformers' traceback
    if [[ -f "$MODEL_DIR/adapter_config.json" ]]; then
        echo "$0: error: $1 is a LoRA adapter, not a model folder: merge it first (training/merge_lora.py)" >&2
    else
        echo "$0: error: $1 is not a model folder (no config.json)" >&2
    fi
    exit 2
fi
PORT="${2:-12345}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$HERE/.venv/bin/python}"
TRANSFORMERS="${TRANSFORMERS:-$HERE/.venv/bin/transformers}"
ENGINE="${ENGINE:-auto}"
export HF_HUB_OFFLINE=1

if [[ "$ENGINE" != transformers ]] && "$PYTHON" -c "import llama_cpp.server" 2>/dev/null; then
    if GGUF="$("$PYTHON" -m mirrorapi.cli models gguf "$MODEL_DIR")"; then
        echo "engine: http://127.0.0.1:$PORT/v1   model name (clients' --model): $MODEL_DIR" >&2
        echo "engine: llama.cpp on $GGUF" >&2
        exec "$PYTHON" -m mirrorapi.llama_cpp_engine --model "$GGUF" --model_alias "$MODEL_DIR" --port "$PORT"
    fi
    [[ "$ENGINE" == auto ]] || exit 1
    echo "engine: no GGUF for this folder (above): transformers serve instead" >&2
elif [[ "$ENGINE" == llama.cpp ]]; then
    echo "engine: llama.cpp's server is not installed in $PYTHON: make engine" >&2
    exit 1
fi
if [[ -z "${HF_HUB_CACHE:-}" ]]; then
    export HF_HUB_CACHE="$HERE/runs/.engine-hub-cache"
    mkdir -p "$HF_HUB_CACHE"
fi
echo "engine: http://127.0.0.1:$PORT/v1   model name (clients' --model): $MODEL_DIR" >&2
exec "$TRANSFORMERS" serve "$MODEL_DIR" --device cpu --host 127.0.0.1 --port "$PORT"
