"""Build the simulator's SFT dataset from real request -> response pairs and tool docs.

Usage:
    python data/build_simulator_sft.py --pairs ../shared/data/pairs/*.jsonl \
        --tools ../shared/data/toolenv/realtools --out runs/data/simulator
    python data/build_simulator_sft.py --stabletoolbench-cache server/tool_response_cache \
        --tools server/tools --out runs/data/simulator-cache
    python data/build_simulator_sft.py --alpaca train_sft.json --out runs/data/simulator-alpaca

Writes a `datasets` DatasetDict (splits `train`, `test_id`, `test_ood`) and `stats.json` to --out;
`accelerate launch training/sft.py --dataset_path OUT` trains on it.
"""

import sys

from mirrorapi.data.commands import build_simulator_sft_command


def main(argv: list[str] | None = None) -> int:
    return build_simulator_sft_command(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
