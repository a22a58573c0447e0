"""A GGUF file (llama.cpp's format) as a normal Hugging Face model folder: safetensors, tokenizer, chat template.

transformers reads GGUF itself (`from_pretrained(folder, gguf_file=...)`, with the `gguf` package): it
dequantises the weights and undoes llama.cpp's q/k row permutation. What it cannot do is save the result,
because the config keeps the GGUF `quantization_config`; so the weights are moved into a model built from
the config without it, and saved from there.

Storage dtype: float16, compute dtype float32. The weights are dequantised from 4-bit blocks (Q4_1: a float16
scale and minimum per 32 values), so float16 keeps them to 4e-4 relative (logits within 0.05 of float32's,
the same greedy tokens), where bfloat16, the original release's dtype, moves logits by up to 0.3; float32
would double the size (517 MB) for nothing. `config.json` says float32, so `from_pretrained(dtype="auto")`,
`transformers serve` and TRL compute in float32: on CPUs without native half-precision matmuls (AVX2)
bfloat16 generation is ~5x slower. Pass `dtype=torch.bfloat16` explicitly on a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STORAGE_DTYPE = "float16"
COMPUTE_DTYPE = "float32"


def hf_folder_from_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Write `out_dir` (which must not exist yet) from `gguf_path`; returns facts for the model card:
    parameters, architecture, tied embeddings, dtypes."""
    import torch  # here, not at the top: `models get` on a folder already made needs neither
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the GGUF loader's; `save_pretrained` refuses it
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    # With tied embeddings the output layer is the embedding matrix itself, not a copy of it.
    allowed_missing = {"lm_head.weight"} if tied else set()
    if set(missing) - allowed_missing or unexpected:
        raise RuntimeError(
            f"GGUF weights do not fit the model built from its config: missing {missing}, unexpected {unexpected}"
        )
    plain.tie_weights()
    if tied and plain.get_output_embeddings().weight.data_ptr() != plain.get_input_embeddings().weight.data_ptr():
        raise RuntimeError("tie_word_embeddings is set but the output layer is not the embedding matrix")
    plain.generation_config = loaded.generation_config
    del loaded
    # A real context limit instead of the "unbounded" placeholder a GGUF tokenizer gets.
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    parameters = sum(p.numel() for p in plain.parameters())  # tied weights count once
    plain.to(getattr(torch, STORAGE_DTYPE)).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    config_path = out_dir / "config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved["dtype"] = COMPUTE_DTYPE  # `dtype="auto"` loads the float16 tensors as float32 (docstring)
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {
        "architecture": type(plain).__name__,
        "parameters": parameters,
        "tied_embeddings": tied,
        "storage_dtype": STORAGE_DTYPE,
        "config_dtype": COMPUTE_DTYPE,
        "has_chat_template": bool(tokenizer.chat_template),
    }
