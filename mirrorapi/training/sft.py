"""`training/sft.py`'s work after parsing: load the inputs, build TRL's SFTTrainer, train, then the
bookkeeping (metrics, model card, optional LoRA merge)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mirrorapi.training.lm_head import logits_only_where_loss
from mirrorapi.training.merge import merge_lora
from mirrorapi.training.model_card import write_model_card
from mirrorapi.training.recipe import (
    RecipeError,
    check_inputs,
    config_file,
    dataset_stats,
    freeze_below_top_layers,
    model_init_kwargs,
    training_splits,
)
from mirrorapi.training.throughput import ThroughputCallback
from mirrorapi.training.time_limit import TimeLimitCallback

if TYPE_CHECKING:
    from transformers import TrainerCallback

logger = logging.getLogger(__name__)

# Keys of the training arguments recorded in the model card (the recipe's own keys are all recorded).
RECORDED_KEYS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "max_length",
    "packing",
    "packing_strategy",
    "padding_free",
    "use_liger_kernel",
    "bf16",
    "seed",
    "completion_only_loss",
    "use_cpu",
)
RECORDED_MODEL_KEYS = ("dtype", "attn_implementation", "model_revision", "load_in_4bit", "load_in_8bit", "use_peft")
RECORDED_LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def build_trainer(recipe, training_args, model_args):
    """(SFTTrainer, DatasetDict of the recipe, train split, {name: eval split}) ready to train; the model is loaded
    here, after every check of the inputs."""
    from trl import SFTTrainer, get_peft_config

    tokenizer, dataset = check_inputs(recipe, training_args, model_args)
    train, evals = training_splits(
        dataset, recipe, tokenizer, training_args.max_length, training_args.dataset_num_proc
    )
    if not evals and training_args.eval_strategy != "no":
        raise RecipeError(f"no record of the eval splits {recipe.eval_splits} fits; pass --eval_strategy no")
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)
    if training_args.include_num_input_tokens_seen == "no":  # ThroughputCallback counts these
        training_args.include_num_input_tokens_seen = "non_padding"
    callbacks: list[TrainerCallback] = [ThroughputCallback()]
    if recipe.max_train_seconds is not None:
        callbacks.append(TimeLimitCallback(recipe.max_train_seconds))
    model, peft_config = model_args.model_name_or_path, get_peft_config(model_args)
    if recipe.init_adapter:  # TRL builds a fresh adapter from peft_config; a trainable PeftModel is taken as it is
        from peft import PeftModel
        from trl.trainer.utils import create_model_from_path  # the base loaded as TRL loads it

        base = create_model_from_path(model, **training_args.model_init_kwargs)
        try:
            model, peft_config = PeftModel.from_pretrained(base, recipe.init_adapter, is_trainable=True), None
        except RuntimeError as exc:  # torch's state-dict size mismatch: an adapter of another base model
            raise RecipeError(
                f"init_adapter {recipe.init_adapter}: its weights do not fit {model_args.model_name_or_path} "
                f"({str(exc).splitlines()[-1].strip()[:200]}); is it the model the adapter was trained on?"
            ) from None
        # The saved adapter names the base it trained on now (merge_lora merges into that), not the one the
        # initial adapter names.
        model.peft_config["default"].base_model_name_or_path = model_args.model_name_or_path
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=evals or None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    if recipe.train_top_layers is not None:  # before train() builds the optimizer over what requires grad
        trainable, total = freeze_below_top_layers(trainer.model, recipe.train_top_layers)
        logger.info("train_top_layers %d: %d of %d parameters trainable", recipe.train_top_layers, trainable, total)
    return trainer, dataset, train, evals


def run_sft(recipe, training_args, model_args, argv: Sequence[str] = ()) -> dict:
    """Train as the recipe says, save weights and model card (and the merged model with --merge); returns the
    metrics. `argv` (the command line) goes into the model card."""
    trainer, dataset, train, evals = build_trainer(recipe, training_args, model_args)
    start = time.perf_counter()
    with logits_only_where_loss(recipe.logits_only_where_loss):
        trainer.train(resume_from_checkpoint=True if recipe.resume else training_args.resume_from_checkpoint)
        metrics = {
            "train_loss": trainer.state.log_history[-1].get("train_loss"),
            "steps": trainer.state.global_step,
            "planned_steps": trainer.state.max_steps,
            "stopped_early": trainer.state.global_step < trainer.state.max_steps,
            "train_seconds": round(time.perf_counter() - start, 1),
            "train_records": len(train),
            **{f"{name}_records": len(data) for name, data in evals.items()},
        }
        if evals:
            metrics.update(final_eval_losses(trainer))
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        stats = dataset_stats(recipe.dataset_path)
        train_split = dataset[recipe.train_split]
        prompt_format = stats.get("prompt_format") or (
            train_split[0]["prompt_format"] if "prompt_format" in train_split.column_names else None
        )
        info = {
            "base_model": model_args.model_name_or_path,
            "kind": stats.get("kind"),
            "prompt_format": prompt_format,
            "adapter": bool(model_args.use_peft),
            "dataset_path": recipe.dataset_path,
            "dataset_stats": stats,
            "recipe": {
                "config_file": config_file(list(argv)),
                "argv": without_secrets(list(argv)),
                "resolved": resolved_keys(recipe, training_args, model_args, trainer),
            },
            "metrics": metrics,
            "log_history": trainer.state.log_history,
        }
        write_model_card(training_args.output_dir, info)
        if recipe.merge:
            merge_lora(
                training_args.output_dir,
                f"{training_args.output_dir}/merged",
                model_args.model_name_or_path,
                revision=model_args.model_revision,
                trust_remote_code=training_args.trust_remote_code,
            )
        logger.info("saved %s (%s)", training_args.output_dir, metrics)
    trainer.accelerator.wait_for_everyone()
    return metrics


def final_eval_losses(trainer) -> dict[str, float]:
    """Eval losses of the final weights: those logged at the last step, else a fresh evaluation."""
    step = trainer.state.global_step
    logged = {
        k: v
        for entry in trainer.state.log_history
        if entry.get("step") == step
        for k, v in entry.items()
        if k.startswith("eval_") and k.endswith("_loss")
    }
    return logged or {k: v for k, v in trainer.evaluate().items() if k.endswith("_loss")}


def without_secrets(argv: list[str]) -> list[str]:
    """A command line as the model card shows it: the value of a `--*_token` or `--*_key` flag (`--hub_token hf_...`,
    which TRL's parser takes) as `<hidden>`, as transformers' own records show the hub token."""
    shown, hide_next = [], False
    for item in argv:
        flag, equals, _ = item.partition("=")
        secret = flag.startswith("--") and flag.endswith(("_token", "_key"))
        if hide_next:
            shown.append("<hidden>")
        elif secret and equals:
            shown.append(f"{flag}=<hidden>")
        else:
            shown.append(item)
        hide_next = secret and not equals and not hide_next
    return shown


def resolved_keys(recipe, training_args, model_args, trainer=None) -> dict:
    """The settings a run actually used (after the recipe file, the command line and the checks' choices); with
    `init_adapter`, the LoRA settings are the loaded adapter's, not the recipe's; padding-free batches and the
    completion-only loss as TRL's trainer settled them (packed with bfd is padding-free whatever `padding_free`
    says; prompt/completion data train on the completions when `completion_only_loss` is unset)."""
    model = trainer.model if trainer is not None else None
    resolved = {k: getattr(training_args, k) for k in RECORDED_KEYS}
    if trainer is not None:
        for key in ("padding_free", "completion_only_loss"):
            if key in resolved and hasattr(trainer, key):
                resolved[key] = getattr(trainer, key)
    lora = RECORDED_LORA_KEYS if model_args.use_peft else ()
    resolved.update({k: getattr(model_args, k) for k in (*RECORDED_MODEL_KEYS, *lora)})
    if model_args.use_peft and recipe.init_adapter and model is not None:
        trained = model.peft_config["default"]
        targets = trained.target_modules
        resolved.update(
            lora_r=trained.r,
            lora_alpha=trained.lora_alpha,
            lora_dropout=trained.lora_dropout,
            lora_target_modules=sorted(targets) if isinstance(targets, set) else targets,
        )
    resolved.update(vars(recipe))
    return resolved
