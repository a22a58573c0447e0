"""LoRA merging: base model + adapter -> one plain model folder that `transformers serve` and
`vllm serve` load as is, with the adapter's model card carried over (marked as not an adapter)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mirrorapi.models.catalogue import BASE_MODELS
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
    card = adapter_dir / TRAINING_FILE
    trained_on = json.loads(card.read_text(encoding="utf-8")).get("base_model") if card.is_file() else None
    if base_model is None and trained_on in BASE_MODELS:
        # Trained on a base model `mirrorapi models get` makes (SmolLM2 from its GGUF): its adapter_config names
        # the hub's original, other weights than it trained on, so that name would give a wrong merge.
        raise RecipeError(
            f"{adapter_dir} was trained on {trained_on!r} as `mirrorapi models get {trained_on}` makes it: pass "
            f"that folder as --base-model (a shipped model: `mirrorapi models get` merges it)"
        )
    base_model = base_model or PeftConfig.from_pretrained(str(adapter_dir)).base_model_name_or_path
    check_model_source(base_model)
    try:
        merge_adapter(adapter_dir, base_model, out_dir, **load_kwargs)
    except OSError as exc:  # a hub name that cannot be fetched (offline), a folder that cannot be read
        raise RecipeError(f"cannot merge into {base_model}: {str(exc).splitlines()[0]}") from None
    if card.is_file():
        write_model_card(out_dir, {**json.loads(card.read_text(encoding="utf-8")), "adapter": False})
    logger.info("merged %s into %s -> %s", adapter_dir, base_model, out_dir)
    return out_dir
