"""A LoRA adapter merged into its base model: one plain folder (safetensors, tokenizer, chat template) that
`transformers serve`, `vllm serve` and the GGUF export take as is. PEFT does the merge; what is ours is where
the tokenizer comes from: the adapter's own folder when training saved one there, else the base model's (a
shipped adapter carries only its weights and its record)."""

from __future__ import annotations

import os
from pathlib import Path


def merge_adapter(
    adapter_dir: str | os.PathLike, base_model: str | os.PathLike, out_dir: str | os.PathLike, **load_kwargs
) -> Path:
    """Write the merge of `adapter_dir` into `base_model` to `out_dir`; `load_kwargs` go to `from_pretrained`
    (revision, trust_remote_code)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    base = AutoModelForCausalLM.from_pretrained(str(base_model), dtype="auto", **load_kwargs)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    has_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(
        str(adapter_dir) if has_tokenizer else str(base_model), **({} if has_tokenizer else load_kwargs)
    )
    tokenizer.save_pretrained(out_dir)
    return out_dir
