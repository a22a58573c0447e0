"""Measure how well a judge agrees with labelled final answers (accuracy, Cohen's kappa, confusion matrix).

Usage:
    python eval/judge_agreement.py --labelled ../shared/data/judge/labelled.jsonl \
        --base-url http://127.0.0.1:12345/v1 --model judge --out runs/judge-agreement

Labelled files use the judge schema of shared/data/judge. Writes `agreement.md`, `agreement.json`
and `predictions.jsonl` (a rerun resumes) into `--out`, per source and overall. Exit status: 0
done, 1 some judge calls failed (rerun to retry them), 2 bad input or an unreachable judge.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.evaluation.commands import JUDGE_AGREEMENT


def main(argv: list[str] | None = None) -> int:
    return run_script(JUDGE_AGREEMENT, argv, __doc__, "judge_agreement.py")


if __name__ == "__main__":
    sys.exit(main())
