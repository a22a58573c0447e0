"""Merge a LoRA adapter written by training/sft.py into its base model (one plain model folder).

Usage:
    python training/merge_lora.py --adapter runs/simulator-qwen2.5-7b-lora --out runs/simulator-merged
    vllm serve runs/simulator-merged --served-model-name mirrorapi --generation-config vllm

`accelerate launch training/sft.py ... --merge true` does the same at the end of training.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.training.commands import MERGE_LORA


def main(argv: list[str] | None = None) -> int:
    return run_script(MERGE_LORA, argv, __doc__, "merge_lora.py")


if __name__ == "__main__":
    sys.exit(main())
