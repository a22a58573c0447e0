"""Fine-tune the simulator or the judge with TRL's SFTTrainer (the dataset decides which).

# Tiny model on a CPU (tests, laptops; minutes)
accelerate launch --config_file training/accelerate/cpu.yaml training/sft.py \
    --config training/configs/tiny_cpu.yaml --model_name_or_path runs/tiny-base \
    --dataset_path runs/data/simulator --output_dir runs/tiny-simulator

# Qwen2.5-7B, full fine-tune on 8 GPUs (DeepSpeed ZeRO-3)
accelerate launch --config_file training/accelerate/deepspeed_zero3.yaml training/sft.py \
    --config training/configs/simulator_qwen2.5-7b_full.yaml

# LoRA on one GPU; --merge also writes the merged model to OUTPUT_DIR/merged
accelerate launch --config_file training/accelerate/single_gpu.yaml training/sft.py \
    --config training/configs/simulator_qwen2.5-7b_lora.yaml --merge true

Every key of a recipe can be given on the command line (`--max_steps 10`); the command line wins.
`--resume true` continues from the last checkpoint in output_dir. Keys: mirrorapi's
`RecipeArguments` (mirrorapi/sft_recipe.py), TRL's `SFTConfig` and `ModelConfig` (`--help`).
A mistake in the inputs ends in one `error:` line before any model is loaded (add `-q` to
`accelerate launch` to hide its own traceback of the failed child process).
"""

import logging
import sys
import time


def main(recipe, training_args, model_args, argv):
    from trl import get_peft_config

    from mirrorapi.training.model_card import write_model_card
    from mirrorapi.training.recipe import (
        RecipeError,
        check_inputs,
        dataset_stats,
        final_eval_losses,
        merge_lora,
        throughput_trainer_class,
        training_splits,
    )

    tokenizer, dataset = check_inputs(recipe, training_args, model_args)
    train, evals = training_splits(dataset, recipe, tokenizer, training_args.max_length,
                                   training_args.dataset_num_proc)
    if not evals and training_args.eval_strategy != "no":
        raise RecipeError(f"no record of the eval splits {recipe.eval_splits} fits; pass --eval_strategy no")
    training_args.model_init_kwargs = {"dtype": model_args.dtype,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}

    trainer = throughput_trainer_class()(
        model=model_args.model_name_or_path, args=training_args, train_dataset=train,
        eval_dataset=evals or None, processing_class=tokenizer, peft_config=get_peft_config(model_args))
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if recipe.resume else training_args.resume_from_checkpoint)
    seconds = time.perf_counter() - start
    metrics = {"train_loss": trainer.state.log_history[-1].get("train_loss"), "steps": trainer.state.global_step,
               "train_seconds": round(seconds, 1), "train_records": len(train),
               **{f"{name}_records": len(data) for name, data in evals.items()}}
    if evals:
        metrics.update(final_eval_losses(trainer))
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        stats = dataset_stats(recipe.dataset_path)
        prompt_format = stats.get("prompt_format") or _column_value(dataset[recipe.train_split], "prompt_format")
        info = {"base_model": model_args.model_name_or_path, "kind": stats.get("kind"), "prompt_format": prompt_format,
                "adapter": bool(model_args.use_peft), "dataset_path": recipe.dataset_path, "dataset_stats": stats,
                "recipe": {"config_file": _config_file(argv), "argv": argv, "resolved": _resolved(
                    recipe, training_args, model_args)},
                "metrics": metrics, "log_history": trainer.state.log_history}
        write_model_card(training_args.output_dir, info)
        if recipe.merge:
            merged = merge_lora(training_args.output_dir, f"{training_args.output_dir}/merged",
                                model_args.model_name_or_path)
            write_model_card(merged, {**info, "adapter": False})
        logging.getLogger("sft").info("saved %s (%s)", training_args.output_dir, metrics)
    trainer.accelerator.wait_for_everyone()
    return metrics


def _column_value(split, column):
    return split[0][column] if column in split.column_names else None


def _config_file(argv):
    return argv[argv.index("--config") + 1] if "--config" in argv else None


def _resolved(recipe, training_args, model_args):
    keys = ("learning_rate", "lr_scheduler_type", "warmup_steps", "max_steps", "num_train_epochs",
            "per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "bf16", "seed",
            "completion_only_loss", "use_cpu")
    resolved = {k: getattr(training_args, k) for k in keys}
    lora = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules") if model_args.use_peft else ()
    resolved.update({k: getattr(model_args, k) for k in ("use_peft", *lora)})
    resolved.update(vars(recipe))
    return resolved


def make_parser():
    from trl import ModelConfig, SFTConfig, TrlParser

    from mirrorapi.training.recipe import RecipeArguments

    return TrlParser((RecipeArguments, SFTConfig, ModelConfig))


def cli(argv=None) -> int:
    from mirrorapi.training.recipe import RecipeError, check_recipe_file

    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = make_parser()
    try:
        check_recipe_file(_config_file(argv), parser.dataclass_types)
        try:
            recipe, training_args, model_args = parser.parse_args_and_config(argv)
        except ValueError as exc:  # SFTConfig's own checks of the keys together (e.g. bf16 on a CPU)
            raise RecipeError(str(exc).splitlines()[0]) from None
        main(recipe, training_args, model_args, argv)
    except RecipeError as exc:
        print(f"sft.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
