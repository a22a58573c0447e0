"""LoRA merging: base model + adapter -> one plain model folder that `transformers serve` and
`vllm serve` load as is, with the adapter's model card carried over (marked as not an adapter)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mirrorapi.models.catalogue import BASE_MODELS
from mirrorapi.models.get import move_into_place, readable_as_the_umask_says
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
    if Path(base_model).is_dir() and Path(base_model).resolve() == out_dir.resolve():
        # It replaced the base with the merged model, and the adapter, still naming that folder, merged twice after.
        raise RecipeError(f"--out {out_dir} is the base model's folder: give --out a new folder for the merged model")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise RecipeError(f"{out_dir} holds files but no model: give --out a new folder, or a model folder to replace")
    # Built beside its place and renamed into it whole (a merge killed half-way left a folder of weights without
    # tokenizer nor record; one into another model's folder kept that model's card and record, and a server then
    # read another model's settings from it).
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        try:
            merge_adapter(adapter_dir, base_model, staging, **load_kwargs)
        except OSError as exc:  # a hub name that cannot be fetched (offline), a folder that cannot be read
            raise RecipeError(f"cannot merge into {base_model}: {str(exc).splitlines()[0]}") from None
        except RuntimeError as exc:  # weights of other shapes: another model than the adapter was trained on
            raise RecipeError(
                f"cannot merge into {base_model}: the adapter's weights do not fit it ({str(exc).splitlines()[0]}; "
                "is it the model the adapter was trained on?)"
            ) from None
        if card.is_file():
            record = json.loads(card.read_text(encoding="utf-8"))
            # the folder it was merged into, so that `models gguf` finds the base from anywhere
            merged_into = str(Path(base_model).resolve()) if Path(base_model).is_dir() else base_model
            write_model_card(staging, {**record, "adapter": False, "base_model": merged_into})
        readable_as_the_umask_says(staging)
        move_into_place(staging, out_dir, complete=lambda folder: False, replace=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("merged %s into %s -> %s", adapter_dir, base_model, out_dir)
    return out_dir
