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

from mirrorapi.command_line import run_script
from mirrorapi.data.commands import BUILD_SIMULATOR_SFT


def main(argv: list[str] | None = None) -> int:
    return run_script(BUILD_SIMULATOR_SFT, argv, __doc__, "build_simulator_sft.py")


if __name__ == "__main__":
    sys.exit(main())
