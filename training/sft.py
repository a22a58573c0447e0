"""Fine-tune the simulator or the judge with TRL's SFTTrainer (the dataset decides which).

    accelerate launch -q --config_file training/accelerate/cpu.yaml training/sft.py \
        --config training/configs/tiny_cpu.yaml [--any_recipe_key VALUE ...]

Recipes: training/configs/ (the README's training section says which runs where). Every key of a recipe
can be given on the command line, which wins; `--help` lists them: mirrorapi's `RecipeArguments`
(mirrorapi/training/recipe.py), TRL's `SFTConfig` and `ModelConfig`. A mistake in the inputs ends in
one `sft.py: error:` line (status 2) before any model is loaded.
"""

import logging
import sys

from mirrorapi.training.recipe import RecipeError, parse_recipe
from mirrorapi.training.sft import run_sft


def cli(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        recipe, training_args, model_args = parse_recipe(argv)
        run_sft(recipe, training_args, model_args, argv)
    except RecipeError as exc:
        print(f"sft.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
