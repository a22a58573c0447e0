"""Build the judge's SFT dataset from labelled final answers (the schema of shared/data/judge).

Usage:
    python data/build_judge_sft.py --labelled ../shared/data/judge/labelled.jsonl --out runs/data/judge

Writes a `datasets` DatasetDict (splits `train`, balanced, and `test`) and `stats.json` to --out;
`accelerate launch training/sft.py --config training/configs/tiny_judge_cpu.yaml --dataset_path OUT`
trains on it.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.data.commands import BUILD_JUDGE_SFT


def main(argv: list[str] | None = None) -> int:
    return run_script(BUILD_JUDGE_SFT, argv, __doc__, "build_judge_sft.py")


if __name__ == "__main__":
    sys.exit(main())
