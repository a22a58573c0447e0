"""Build the judge's SFT dataset from labelled final answers (the schema of shared/data/judge).

Usage:
    python data/build_judge_sft.py --labelled ../shared/data/judge/labelled.jsonl --out runs/data/judge

Writes a `datasets` DatasetDict (splits `train`, balanced, and `test`) and `stats.json` to --out;
`accelerate launch training/sft.py --config training/configs/tiny_judge_cpu.yaml --dataset_path OUT`
trains on it.
"""

import sys

from mirrorapi.data.commands import build_judge_sft_command


def main(argv: list[str] | None = None) -> int:
    return build_judge_sft_command(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
