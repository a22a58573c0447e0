"""Fine-tune the simulator or the judge with TRL's SFTTrainer (the dataset decides which).

    accelerate launch -q --config_file training/accelerate/cpu.yaml training/sft.py \
        --config training/configs/tiny_cpu.yaml [--any_recipe_key VALUE ...]

Recipes: training/configs/ (the README's training section says which runs where). Every key of a recipe
can be given on the command line, which wins; `--help` lists them: mirrorapi's `RecipeArguments`
(mirrorapi/training/recipe.py), TRL's `SFTConfig` and `ModelConfig`. A mistake in the inputs ends in
one `sft.py: error:` line (status 2; 1 under `accelerate launch`) before any model is loaded.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.training.commands import SFT


def cli(argv: list[str] | None = None) -> int:
    return run_script(SFT, argv, __doc__, "sft.py")


if __name__ == "__main__":
    sys.exit(cli())
