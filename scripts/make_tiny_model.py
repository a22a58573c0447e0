"""Build a tiny Qwen2-architecture model from scratch (tokenizer trained locally, random weights).

    python scripts/make_tiny_model.py --out runs/tiny-base [--corpus FILE ...] [--hidden-size 128 --layers 2]

The folder loads with `AutoModelForCausalLM.from_pretrained(DIR)` and `transformers serve DIR`.
"""

import argparse
import time
from pathlib import Path

from mirrorapi.command_line import out_folder_problem
from mirrorapi.training.tiny_model import CorpusError, build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", required=True, type=Path, help="Folder to write the model into.")
    parser.add_argument(
        "--corpus",
        nargs="+",
        type=Path,
        help="Text/JSON/JSONL files to train the tokenizer on (default: the bundled data/samples).",
    )
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if problem := out_folder_problem(args.out):  # a file, or not writable: said before the build, in one line
        parser.error(problem)
    start = time.perf_counter()
    try:
        out = build_tiny_model(
            args.out,
            corpus=args.corpus,
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            layers=args.layers,
            seed=args.seed,
        )
    except CorpusError as exc:  # a --corpus file that is missing or holds no text: one line, not a traceback
        parser.error(str(exc))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(out)
    print(
        f"tiny {config.model_type} model (vocab {config.vocab_size}, hidden {config.hidden_size}, "
        f"{config.num_hidden_layers} layers) -> {out} in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
