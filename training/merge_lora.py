"""Merge a LoRA adapter written by training/sft.py into its base model (one plain model folder).

Usage:
    python training/merge_lora.py --adapter runs/simulator-qwen2.5-7b-lora --out runs/simulator-merged
    vllm serve runs/simulator-merged --served-model-name mirrorapi --generation-config vllm

`accelerate launch training/sft.py ... --merge true` does the same at the end of training.
"""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--adapter", required=True, help="Adapter folder (adapter_config.json).")
    parser.add_argument("--out", required=True, help="Folder for the merged model.")
    parser.add_argument("--base-model", help="Base model (default: the one recorded in the adapter).")
    args = parser.parse_args(argv)

    from mirrorapi.training.merge import merge_lora
    from mirrorapi.training.recipe import RecipeError

    try:
        out = merge_lora(args.adapter, args.out, args.base_model)
    except RecipeError as exc:
        print(f"merge_lora.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {args.adapter} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
