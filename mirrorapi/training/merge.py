"""LoRA merging: base model + adapter -> one plain model folder that `transformers serve` and
`vllm serve` load as is, with the adapter's model card carried over (marked as not an adapter)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mirrorapi.models.merge import merge_adapter
from mirrorapi.training.model_card import TRAINING_FILE, write_model_card
from mirrorapi.training.recipe import RecipeError, check_model_source

logger = logging.getLogger(__name__)


def merge_lora(
    adapter_dir: str | os.PathLike, out_dir: str | os.PathLike, base_model: str | None = None, **load_kwargs
) -> Path:
    """Merge `adapter_dir` into its base model (the one recorded in the adapter unless `base_model` is given);
    `load_kwargs` go to `from_pretrained` (revision, trust_remote_code)."""
    from peft import PeftConfig

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise RecipeError(f"{adapter_dir} is not a LoRA adapter folder (no adapter_config.json)")
    base_model = base_model or PeftConfig.from_pretrained(str(adapter_dir)).base_model_name_or_path
    check_model_source(base_model)
    merge_adapter(adapter_dir, base_model, out_dir, **load_kwargs)
    card = adapter_dir / TRAINING_FILE
    if card.is_file():
        write_model_card(out_dir, {**json.loads(card.read_text(encoding="utf-8")), "adapter": False})
    logger.info("merged %s into %s -> %s", adapter_dir, base_model, out_dir)
    return out_dir
