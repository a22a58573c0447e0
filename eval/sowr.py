"""SoWR: win rate of candidate models' answers against a reference model's, with an open judge.

    python eval/sowr.py --reference runs/answers/chatgpt_cot --candidate runs/answers/qwen7b_cot \
        --ids solvable_queries/test_query_ids --base-url http://127.0.0.1:12345/v1 --model judge --out runs/sowr

Answers are converted `<model>/<group>.json` files (eval/run_agent.py's --out). SoPR verdicts first
(reused from a SoPR run in the same --out), then pairwise preferences (`sowr-v1`). Exit: 0 done,
1 judge calls failed (rerun to retry), 2 bad input or an unreachable judge.
"""
import sys
from pathlib import Path

from mirrorapi.evaluation.answers.items import AnswersError
from mirrorapi.evaluation.cli_args import judge_settings_from, sowr_parser
from mirrorapi.evaluation.judge.scoring import JudgeRunError
from mirrorapi.evaluation.judge.sowr import run_sowr


def main(argv=None) -> int:
    args = sowr_parser(__doc__).parse_args(argv)
    try:
        run = run_sowr(args.reference, args.candidate, args.ids, judge_settings_from(args), args.out,
                       rounds=max(1, args.rounds), overwrite=args.overwrite, progress=not args.no_progress)
    except (ValueError, AnswersError, JudgeRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "sowr.md").read_text(encoding="utf-8"))
    if run.failures:
        print(f"{len(run.failures)} judge call(s) failed, e.g. {run.failures[0]}; rerun to retry them.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
