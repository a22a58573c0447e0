"""The data commands behind `data/build_simulator_sft.py` and `data/build_judge_sft.py`: flags, input
checks, the build, the one-line JSON summary. The scripts hold their usage text and call these.

Bad input is one line `<script>: error: ...` on stderr and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time

from mirrorapi.data.judge_sft import JUDGE_COLUMNS, TRAINABLE_JUDGE_FORMATS, build_judge_records, read_labelled
from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
from mirrorapi.data.sources import read_alpaca
from mirrorapi.prompts import HISTORY_CHAR_BUDGET, SESSION_FORMAT, SIMULATOR_FORMATS
from mirrorapi.records import SourceError, read_pairs_jsonl, read_stabletoolbench_cache
from mirrorapi.tools import RegistryError, ToolRegistry

SIMULATOR_SCRIPT, JUDGE_SCRIPT = "build_simulator_sft.py", "build_judge_sft.py"


def _parser(usage: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=usage.splitlines()[0], epilog=usage,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)


def _fail(script: str, message: str) -> int:
    print(f"{script}: error: {message}", file=sys.stderr)
    return 2


def _summary(out: str, stats: dict, start: float, **extra) -> str:
    return json.dumps({"out": out, "read": stats["read"]["total"], "dropped": stats["dropped"], **extra,
                       "splits": {k: v["records"] for k, v in stats["splits"].items()},
                       "seconds": round(time.perf_counter() - start, 1)})


def _note_unreadable(stats: dict, bad: list[str], inputs: dict) -> None:
    stats["dropped"]["unreadable"] = len(bad)
    stats["unreadable_examples"] = bad[:10]
    stats["inputs"] = inputs


# ------------------------------------------------------------------------------------------- simulator
def simulator_sft_parser(usage: str) -> argparse.ArgumentParser:
    parser = _parser(usage)
    parser.add_argument("--pairs", nargs="+", default=[], help="Pair JSONL files (the schema of shared/data/pairs).")
    parser.add_argument("--stabletoolbench-cache", nargs="+", default=[], metavar="FOLDER",
                        help="StableToolBench cache folders (<cat>/<tool>_for_<cat>/<api>.json).")
    parser.add_argument("--alpaca", nargs="+", default=[], metavar="FILE",
                        help="MirrorAPI-style alpaca files (system/instruction/output; JSON list or JSONL).")
    parser.add_argument("--tools", nargs="+", default=[], metavar="SOURCE",
                        help="Tools folders / query files with the docs of the pairs' APIs.")
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--prompt-format", default="mirrorapi-v1", choices=SIMULATOR_FORMATS,
                        help="Simulator prompt format (mirrorapi/prompts.py); mirrorapi-v2 writes responses that hold "
                             "JSON as JSON values, not escaped strings (the SmolLM2 recipes' data).")
    parser.add_argument("--system-prompt-file", help="System prompt for the stabletoolbench formats.")
    parser.add_argument("--few-shot", type=int, default=0,
                        help="Real examples of the same API per prompt; match the server's `few_shot` setting.")
    parser.add_argument("--few-shot-char-budget", type=int, default=2048,
                        help="Most characters of examples per prompt; match the server's `few_shot_char_budget`.")
    parser.add_argument("--few-shot-response-chars", type=int, default=0,
                        help="Shrink each example's response to about this many characters, JSON kept valid (0: "
                             "whole); match the server's `few_shot_response_chars`.")
    parser.add_argument("--target-response-chars", type=int, default=0,
                        help="Shrink the training targets of longer real responses to about this many characters, "
                             "JSON kept valid, so their records fit max_length (0: whole, cut at 2,048 characters).")
    parser.add_argument("--history", type=int, default=0, metavar="K",
                        help="Show each call's K earlier episode calls (newest first; format mirrorapi-session-v1, "
                             "chosen automatically); match the server's `session_history`.")
    parser.add_argument("--history-char-budget", type=int, default=HISTORY_CHAR_BUDGET,
                        help="Most characters of history per prompt; match the server's `session_char_budget`.")
    parser.add_argument("--ood-fraction", type=float, default=0.05, help="Share of APIs held out (test_ood).")
    parser.add_argument("--id-fraction", type=float, default=0.05,
                        help="Share of the other episodes held out (test_id).")
    parser.add_argument("--seed", type=int, default=42)
    return parser


def build_simulator_sft_command(argv: list[str] | None, usage: str) -> int:
    args = simulator_sft_parser(usage).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not (args.pairs or args.stabletoolbench_cache or args.alpaca):
        return _fail(SIMULATOR_SCRIPT, "give at least one of --pairs, --stabletoolbench-cache, --alpaca")
    if (args.pairs or args.stabletoolbench_cache) and not args.tools:
        return _fail(SIMULATOR_SCRIPT, "--pairs and --stabletoolbench-cache need --tools (the API docs)")
    start = time.perf_counter()
    bad: list[str] = []
    try:
        system_prompt = open(args.system_prompt_file, encoding="utf-8").read() if args.system_prompt_file else None
        prompt_format = SESSION_FORMAT if args.history and args.prompt_format == "mirrorapi-v1" else args.prompt_format
        options = SimulatorDataOptions(prompt_format, system_prompt, args.few_shot, args.few_shot_char_budget,
                                       args.few_shot_response_chars, args.target_response_chars,
                                       ood_fraction=args.ood_fraction, id_fraction=args.id_fraction, seed=args.seed,
                                       history=args.history, history_char_budget=args.history_char_budget)
        options.check()
        registry = ToolRegistry.load(args.tools)
        sources = [read_pairs_jsonl(p, bad.append) for p in args.pairs]
        sources += [read_stabletoolbench_cache(f, bad.append) for f in args.stabletoolbench_cache]
        sources += [read_alpaca(f, bad.append) for f in args.alpaca]
        splits, stats = build_simulator_records(itertools.chain(*sources), registry, options, progress=True)
    except (SourceError, RegistryError, ValueError, OSError) as exc:
        return _fail(SIMULATOR_SCRIPT, str(exc))
    _note_unreadable(stats, bad, {"pairs": args.pairs, "stabletoolbench_cache": args.stabletoolbench_cache,
                                  "alpaca": args.alpaca, "tools": args.tools})
    stats["build_seconds"] = round(time.perf_counter() - start, 2)
    write_sft_dataset(args.out, splits, stats)
    print(_summary(args.out, stats, start, kept=stats["kept"]))
    return 0


# ------------------------------------------------------------------------------------------- judge
def judge_sft_parser(usage: str) -> argparse.ArgumentParser:
    parser = _parser(usage)
    parser.add_argument("--labelled", nargs="+", required=True, help="Labelled answer JSONL files.")
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--prompt-format", default="fac-v1", choices=TRAINABLE_JUDGE_FORMATS)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="Share of queries held out (test).")
    parser.add_argument("--no-balance", action="store_true", help="Keep the training split's natural balance.")
    parser.add_argument("--seed", type=int, default=42)
    return parser


def build_judge_sft_command(argv: list[str] | None, usage: str) -> int:
    args = judge_sft_parser(usage).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    bad: list[str] = []
    try:
        records = itertools.chain(*[read_labelled(path, bad.append) for path in args.labelled])
        splits, stats = build_judge_records(records, args.prompt_format, args.test_fraction,
                                            not args.no_balance, args.seed)
    except (SourceError, ValueError, OSError) as exc:
        return _fail(JUDGE_SCRIPT, str(exc))
    _note_unreadable(stats, bad, {"labelled": args.labelled})
    write_sft_dataset(args.out, splits, stats, JUDGE_COLUMNS)
    print(_summary(args.out, stats, start))
    return 0
