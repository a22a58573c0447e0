"""Measure how well a judge agrees with labelled final answers (accuracy, Cohen's kappa, confusion matrix).

Usage:
    python eval/judge_agreement.py --labelled ../shared/data/judge/labelled.jsonl \
        --base-url http://127.0.0.1:12345/v1 --model judge --out runs/judge-agreement

Labelled files use the judge schema of shared/data/judge. Writes `agreement.md`, `agreement.json`
and `predictions.jsonl` (a rerun resumes) into `--out`, per source and overall. Exit status: 0
done, 1 some judge calls failed (rerun to retry them), 2 bad input or an unreachable judge.
"""

from __future__ import annotations

import argparse
import logging
import sys

from mirrorapi.evaluation.answer_files import AnswersError
from mirrorapi.evaluation.judge_agreement import render_markdown, run_agreement
from mirrorapi.evaluation.judging import JudgeRunError, JudgeSettings


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--labelled", required=True, nargs="+", metavar="FILE.jsonl",
                        help="Labelled answers in the judge schema.")
    parser.add_argument("--base-url", required=True, nargs="+", metavar="URL",
                        help="OpenAI-compatible base URL(s) of the judge engine, e.g. http://127.0.0.1:12345/v1.")
    parser.add_argument("--model", required=True, help="The judge's model name on that engine.")
    parser.add_argument("--out", default="runs/judge-agreement", help="Output folder (default runs/judge-agreement).")
    parser.add_argument("--limit", type=int, default=None, help="Judge only the first N records of each source.")
    parser.add_argument("--concurrency", type=int, default=16, help="Judge requests in flight (default 16).")
    parser.add_argument("--max-tokens", type=int, default=256, help="Tokens per judge output (default 256).")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds per judge call, retries included.")
    parser.add_argument("--api-key", default="EMPTY", help="API key of the engine (default EMPTY).")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.concurrency < 1 or args.max_tokens < 1 or (args.limit is not None and args.limit < 1):
        print("error: --concurrency, --max-tokens and --limit must be at least 1", file=sys.stderr)
        return 2
    settings = JudgeSettings(base_urls=args.base_url, model=args.model, api_key=args.api_key,
                             concurrency=args.concurrency, max_tokens=args.max_tokens, timeout=args.timeout)
    try:
        report, failures = run_agreement(args.labelled, settings, args.out, limit=args.limit,
                                         progress=not args.no_progress)
    except (AnswersError, JudgeRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_markdown(report))
    if failures:
        print(f"{len(failures)} judge call(s) failed, e.g. {failures[0]}; rerun the same command to retry them.",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
