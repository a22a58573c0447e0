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

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mirrorapi.evaluation.answer_files import AnswersError
from mirrorapi.evaluation.judging import METRICS, JudgeRunError, JudgeSettings, run_scoring


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--answers", required=True, help="A converted answer file <model>/<group>.json, or a folder.")
    parser.add_argument("--ids", required=True, help="A test_query_ids (or test_instruction) file, or a folder.")
    parser.add_argument("--base-url", required=True, nargs="+", metavar="URL",
                        help="OpenAI-compatible base URL(s) of the judge engine, e.g. http://127.0.0.1:12345/v1.")
    parser.add_argument("--model", required=True, help="The judge's model name on that engine.")
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--metric", choices=sorted(METRICS), default="fac", help="fac (default) or sopr.")
    parser.add_argument("--repeats", type=int, default=1, help="Judge each answer N times; mean ± std (default 1).")
    parser.add_argument("--concurrency", type=int, default=16, help="Judge requests in flight (default 16).")
    parser.add_argument("--max-tokens", type=int, default=256, help="Tokens per judge output (default 256).")
    parser.add_argument("--temperature", type=float, default=0.0, help="Judge temperature (default 0).")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds per judge call, retries included.")
    parser.add_argument("--api-key", default="EMPTY", help="API key of the engine (default EMPTY).")
    parser.add_argument("--overwrite", action="store_true", help="Drop this metric's earlier verdicts in --out.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.repeats < 1 or args.concurrency < 1 or args.max_tokens < 1:
        print("error: --repeats, --concurrency and --max-tokens must be at least 1", file=sys.stderr)
        return 2
    settings = JudgeSettings(base_urls=args.base_url, model=args.model, api_key=args.api_key,
                             concurrency=args.concurrency, max_tokens=args.max_tokens,
                             temperature=args.temperature, timeout=args.timeout)
    try:
        run = run_scoring(args.answers, args.ids, settings, args.out, metric=args.metric, repeats=args.repeats,
                          overwrite=args.overwrite, progress=not args.no_progress)
    except (AnswersError, JudgeRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / f"{args.metric}.md").read_text(encoding="utf-8"))
    if run.failures:
        print(f"{len(run.failures)} judge call(s) failed, e.g. {run.failures[0]}; rerun the same command to "
              "retry them.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
