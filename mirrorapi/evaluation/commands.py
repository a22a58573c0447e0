"""The eval commands behind `eval/fac.py`, `eval/judge_agreement.py` and `eval/simulator.py`: flags,
input checks, exit statuses. The scripts hold their usage text (their docstring) and call these.

Exit statuses: 0 done, 1 some judge calls failed (a rerun retries them), 2 bad input or an engine or
server that does not answer; every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mirrorapi.evaluation.answers.items import AnswersError
from mirrorapi.evaluation.cli_args import add_judge_arguments, judge_settings_from
from mirrorapi.evaluation.fidelity.metrics import FidelityError
from mirrorapi.evaluation.fidelity.replay import run_fidelity
from mirrorapi.evaluation.judge.agreement import render_markdown, run_agreement
from mirrorapi.evaluation.judge.scoring import JUDGE_METRICS, JudgeRunError, run_scoring


def command_parser(usage: str) -> argparse.ArgumentParser:
    """A parser whose description is the first line of the script's docstring and whose epilog is all of it."""
    return argparse.ArgumentParser(description=usage.splitlines()[0], epilog=usage,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _judge_failures(failures: list[str]) -> int:
    if not failures:
        return 0
    print(f"{len(failures)} judge call(s) failed, e.g. {failures[0]}; rerun the same command to retry them.",
          file=sys.stderr)
    return 1


def _log_to_stderr() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")


# ------------------------------------------------------------------------------------------- FAC / SoPR
def fac_parser(usage: str) -> argparse.ArgumentParser:
    parser = command_parser(usage)
    parser.add_argument("--answers", required=True, help="A converted answer file <model>/<group>.json, or a folder.")
    parser.add_argument("--ids", required=True, help="A test_query_ids (or test_instruction) file, or a folder.")
    add_judge_arguments(parser)
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--metric", choices=sorted(JUDGE_METRICS), default="fac", help="fac (default) or sopr.")
    parser.add_argument("--repeats", type=int, default=1, help="Judge each answer N times; mean ± std (default 1).")
    parser.add_argument("--overwrite", action="store_true", help="Drop this metric's earlier verdicts in --out.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def fac_command(argv: list[str] | None, usage: str) -> int:
    args = fac_parser(usage).parse_args(argv)
    _log_to_stderr()
    if args.repeats < 1:
        return _fail("--repeats must be at least 1")
    try:
        run = run_scoring(args.answers, args.ids, judge_settings_from(args), args.out, metric=args.metric,
                          repeats=args.repeats, overwrite=args.overwrite, progress=not args.no_progress)
    except (ValueError, AnswersError, JudgeRunError) as exc:
        return _fail(str(exc))
    print((Path(args.out) / f"{args.metric}.md").read_text(encoding="utf-8"))
    return _judge_failures(run.failures)


# ------------------------------------------------------------------------------------------- judge agreement
def judge_agreement_parser(usage: str) -> argparse.ArgumentParser:
    parser = command_parser(usage)
    parser.add_argument("--labelled", required=True, nargs="+", metavar="FILE.jsonl",
                        help="Labelled answers in the judge schema.")
    add_judge_arguments(parser)
    parser.add_argument("--out", default="runs/judge-agreement", help="Output folder (default runs/judge-agreement).")
    parser.add_argument("--limit", type=int, default=None, help="Judge only the first N records of each source.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def judge_agreement_command(argv: list[str] | None, usage: str) -> int:
    args = judge_agreement_parser(usage).parse_args(argv)
    _log_to_stderr()
    if args.limit is not None and args.limit < 1:
        return _fail("--limit must be at least 1")
    try:
        report, failures = run_agreement(args.labelled, judge_settings_from(args), args.out, limit=args.limit,
                                         progress=not args.no_progress)
    except (ValueError, AnswersError, JudgeRunError) as exc:
        return _fail(str(exc))
    print(render_markdown(report))
    return _judge_failures(failures)


# ------------------------------------------------------------------------------------------- fidelity
def fidelity_parser(usage: str) -> argparse.ArgumentParser:
    parser = command_parser(usage)
    parser.add_argument("--pairs", required=True, nargs="+", metavar="HELDOUT.jsonl",
                        help="Held-out real pairs (the pair schema of shared/data/pairs).")
    parser.add_argument("--server", required=True,
                        help="The virtual server, e.g. http://127.0.0.1:8080 (or .../virtual).")
    parser.add_argument("--out", required=True, help="Output folder (created).")
    parser.add_argument("--baseline-pairs", nargs="+", default=[], metavar="TRAIN.jsonl",
                        help="Training pairs for the nearest-example baseline.")
    parser.add_argument("--tools", nargs="+", default=[], metavar="FOLDER",
                        help="Tool docs (folders or files) for schema conformance.")
    parser.add_argument("--embedding-model", default=None, metavar="PATH",
                        help="A local transformers model folder for embedding cosine (optional).")
    parser.add_argument("--history", choices=("off", "on", "both"), default="off",
                        help="off: each call alone; on: one session per episode (X-Session-Id); both: both passes, "
                             "with per-step fidelity and the consistency score of each (default off).")
    parser.add_argument("--heldout-episodes", action="store_true",
                        help="Keep only the episodes data/build_simulator_sft.py holds out (test_id, test_ood; "
                             "default fractions and seed); needs --tools.")
    parser.add_argument("--heldout-history", type=int, default=0, metavar="K",
                        help="The --history K the SFT set was built with (its split depends on it; default 0).")
    parser.add_argument("--max-episodes", type=int, default=None, metavar="N", help="Replay at most N episodes, taken from each source in turn.")
    parser.add_argument("--concurrency", type=int, default=8, help="Episodes replayed at once (default 8).")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds per request (default 120).")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def fidelity_command(argv: list[str] | None, usage: str) -> int:
    args = fidelity_parser(usage).parse_args(argv)
    _log_to_stderr()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    if args.concurrency < 1 or args.timeout <= 0:
        return _fail("--concurrency must be at least 1 and --timeout positive")
    if args.embedding_model and not Path(args.embedding_model).is_dir():
        return _fail(f"embedding model folder not found: {args.embedding_model}")
    try:
        run_fidelity(args.pairs, args.server, args.out, baseline_pairs=args.baseline_pairs, tools=args.tools,
                     embedding_model=args.embedding_model, concurrency=args.concurrency, timeout=args.timeout,
                     progress=not args.no_progress, history=args.history, heldout_only=args.heldout_episodes,
                     max_episodes=args.max_episodes, heldout_history=args.heldout_history)
    except FidelityError as exc:
        return _fail(str(exc))
    print((Path(args.out) / "fidelity.md").read_text(encoding="utf-8"))
    return 0
