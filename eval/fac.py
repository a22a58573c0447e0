"""Score StableToolBench final answers with an open judge: FAC (default) or SoPR.

Usage:
    python eval/fac.py --answers data/model_predictions_converted --ids solvable_queries/test_query_ids \
        --base-url http://127.0.0.1:12345/v1 --model judge --out runs/fac
    python eval/fac.py ... --metric sopr --repeats 3

`--answers` is one `<model>/<group>.json` converted answer file or a folder of them (one row per
model); `--ids` a test_query_ids file or folder. Writes `answers.jsonl` and `<metric>.{md,csv,json}`
into `--out`; a rerun skips the judgments already there. Exit status: 0 done, 1 some judge calls
failed (rerun to retry them), 2 bad input or an unreachable judge.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.evaluation.commands import FAC


def main(argv: list[str] | None = None) -> int:
    return run_script(FAC, argv, __doc__, "fac.py")


if __name__ == "__main__":
    sys.exit(main())
