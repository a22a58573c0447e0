"""SoWR: win rate of candidate models' answers against a reference model's, with an open judge.

    python eval/sowr.py --reference runs/answers/chatgpt_cot --candidate runs/answers/qwen7b_cot \
        --ids solvable_queries/test_query_ids --base-url http://127.0.0.1:12345/v1 --model judge --out runs/sowr

Answers are converted `<model>/<group>.json` files (eval/run_agent.py's --out). SoPR verdicts first
(reused from a SoPR run in the same --out), then pairwise preferences (`sowr-v1`). Exit: 0 done,
1 judge calls failed (rerun to retry), 2 bad input or an unreachable judge.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.evaluation.commands import SOWR


def main(argv: list[str] | None = None) -> int:
    return run_script(SOWR, argv, __doc__, "sowr.py")


if __name__ == "__main__":
    sys.exit(main())
