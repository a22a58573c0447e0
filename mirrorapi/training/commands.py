"""The training stage's commands: `mirrorapi train sft | merge-lora`, which training/sft.py and
training/merge_lora.py run alone.

`train sft` hands its arguments to TRL's parser (mirrorapi/training/recipe.py): the recipe's keys are the
fields of `RecipeArguments`, `SFTConfig` and `ModelConfig`, one flag each (`--help` lists them).
"""

from __future__ import annotations

import argparse
import logging

from mirrorapi.command_line import Command, add_group
from mirrorapi.training.recipe import RecipeError


def sft(args: argparse.Namespace) -> int:
    from mirrorapi.training.recipe import parse_recipe
    from mirrorapi.training.sft import run_sft

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    recipe, training_args, model_args = parse_recipe(args.passthrough, args.prog)
    run_sft(recipe, training_args, model_args, args.passthrough)
    return 0


def merge_lora_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", required=True, help="Adapter folder (adapter_config.json).")
    parser.add_argument("--out", required=True, help="Folder for the merged model.")
    parser.add_argument("--base-model", help="Base model (default: the one recorded in the adapter).")


def merge_lora(args: argparse.Namespace) -> int:
    from mirrorapi.training.merge import merge_lora as merge

    out = merge(args.adapter, args.out, args.base_model)
    print(f"merged {args.adapter} -> {out}")
    return 0


SFT = Command(
    "sft",
    "Fine-tune the simulator or the judge with TRL's SFTTrainer (`--config RECIPE.yaml`; "
    "`--help` lists the recipe keys).",
    lambda parser: None,
    sft,
    (RecipeError,),
    passthrough=True,
)
MERGE_LORA = Command(
    "merge-lora",
    "Merge a LoRA adapter written by `train sft` into its base model.",
    merge_lora_arguments,
    merge_lora,
    (RecipeError,),
)


def register(sub) -> None:
    """The training stage's subcommands of `mirrorapi`."""
    add_group(sub, "train", "Fine-tune and merge models (the commands of training/*.py).", [SFT, MERGE_LORA])
