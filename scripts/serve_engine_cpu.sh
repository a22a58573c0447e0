#!/usr/bin/env bash
# The CPU engine for the virtual API server: `transformers serve` of a local model folder on 127.0.0.1.
#
#   scripts/serve_engine_cpu.sh runs/demo/latest/simulator [PORT]     # PORT defaults to 12345
#   python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml --model "$PWD/runs/demo/latest/simulator"
#
# Flags that matter (notes/engines.md):
# - `transformers serve DIR` answers only requests whose `model` is the string it was started with
#   (else HTTP 400 "Server is pinned to ..."). It is started here with the folder's absolute path
#   as typed, links kept ("$PWD/MODEL_DIR" for a relative MODEL_DIR, printed below): every client
#   sends that same string.
# - the folder is preloaded (FORCE_MODEL argument) and never reloaded; `--device cpu`.
# - `GET /v1/models` answers 500 unless the hub cache folder exists: a private one is made here.
# - no model hub is reached (HF_HUB_OFFLINE=1); `response_format` is accepted but not enforced.
set -euo pipefail
if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: $0 MODEL_DIR [PORT]   (MODEL_DIR: a model folder, e.g. runs/demo/latest/simulator)" >&2
    exit 2
fi
MODEL_DIR="$(cd "$1" && pwd -L)"  # logical: runs/demo/latest stays a link, as clients type it
PORT="${2:-12345}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
TRANSFORMERS="${TRANSFORMERS:-$HERE/.venv/bin/transformers}"
export HF_HUB_OFFLINE=1
export HF_HUB_CACHE="${HF_HUB_CACHE:-$(mktemp -d -t mirrorapi-hf-XXXXXX)}"
echo "engine: http://127.0.0.1:$PORT/v1   model name (clients' --model): $MODEL_DIR" >&2
exec "$TRANSFORMERS" serve "$MODEL_DIR" --device cpu --host 127.0.0.1 --port "$PORT"
