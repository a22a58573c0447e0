#!/usr/bin/env bash
# The GPU engine for the virtual API server: `vllm serve` of a trained simulator (GPU hosts only;
# `pip install -e ".[serve,vllm]"`).
#
#   scripts/serve_engine_vllm.sh MODEL_DIR [PORT]                      # PORT defaults to 12345
#   LORA=runs/lora-adapter scripts/serve_engine_vllm.sh BASE_MODEL_DIR  # a LoRA adapter on its base
#   python serving/main_mirrorapi.py --config serving/config_mirrorapi.yml   # model: mirrorapi
#
# Flags that matter (notes/engines.md):
# - `--served-model-name mirrorapi`: the name the server's `model` setting sends (a LoRA adapter is
#   served as `mirrorapi` instead, and the base model under its own name).
# - `--generation-config vllm`: otherwise the model folder's generation_config.json silently sets
#   sampling defaults (Qwen2.5: temperature 0.7, top_p 0.8, repetition_penalty 1.05).
# - structured output is on by default in vLLM (the server sends `response_format` json_schema);
#   `disable_any_whitespace` keeps the JSON compact, as the model was trained.
# - prefix caching is on by default: the prompt puts the static API doc first, the request last.
# - for batch-independent (reproducible) sampling set VLLM_BATCH_INVARIANT=1 (slower); the
#   response cache is what makes a benchmark reproducible.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: [LORA=ADAPTER_DIR] $0 MODEL_DIR [PORT]" >&2
    exit 2
fi
MODEL="$1"
PORT="${2:-12345}"
ARGS=(--host 127.0.0.1 --port "$PORT" --api-key "${API_KEY:-EMPTY}" --generation-config vllm
      --structured-outputs-config '{"disable_any_whitespace": true}' --max-model-len "${MAX_MODEL_LEN:-8192}")
if [[ -n "${LORA:-}" ]]; then
    ARGS+=(--enable-lora --lora-modules "mirrorapi=$LORA" --max-lora-rank "${MAX_LORA_RANK:-64}")
else
    ARGS+=(--served-model-name mirrorapi)
fi
echo "engine: http://127.0.0.1:$PORT/v1   model: mirrorapi" >&2
exec vllm serve "$MODEL" "${ARGS[@]}"
