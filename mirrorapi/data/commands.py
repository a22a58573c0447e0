"""The data stage's commands: `mirrorapi data build-simulator-sft | build-judge-sft`, which the scripts
data/build_simulator_sft.py and data/build_judge_sft.py run alone (their docstring is their usage):
flags, input checks, the build, the one-line JSON summary.

Bad input is one line `<prog>: error: ...` on stderr and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import time
from pathlib import Path

from mirrorapi.command_line import Command, add_group, add_settings_arguments, out_folder_problem, settings_from_args
from mirrorapi.data.judge_sft import BALANCE_RULES, JUDGE_COLUMNS, TRAINABLE_JUDGE_FORMATS, build_judge_records
from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
from mirrorapi.data.sources import read_alpaca
from mirrorapi.prompts.judge_formats import JUDGE_VERDICTS
from mirrorapi.prompts.simulator_formats import DEFAULT_SIMULATOR_FORMAT, STRUCTURED_FORMAT, session_format
from mirrorapi.records import SourceError, read_labelled, read_pairs_jsonl, read_stabletoolbench_cache
from mirrorapi.splits import SPLIT_RULES
from mirrorapi.tools import RegistryError, ToolRegistry

USER_ERRORS = (SourceError, RegistryError, ValueError, OSError)
logger = logging.getLogger(__name__)


def _summary(out: str, stats: dict, start: float, **extra) -> str:
    return json.dumps(
        {
            "out": out,
            "read": stats["read"]["total"],
            "dropped": stats["dropped"],
            **extra,
            "splits": {k: v["records"] for k, v in stats["splits"].items()},
            "seconds": round(time.perf_counter() - start, 1),
        }
    )


def _note_unreadable(stats: dict, bad: list[str], inputs: dict) -> None:
    if bad:  # a count in the summary alone went unseen: lost lines are said where errors are
        logger.warning("%s unreadable line(s) skipped, e.g. %s", f"{len(bad):,}", bad[0])
    stats["dropped"]["unreadable"] = len(bad)
    stats["unreadable_examples"] = bad[:10]
    stats["inputs"] = inputs


def _check_out(out: str, inputs: list[str]) -> None:
    """ValueError when the build's replacing `out` would delete what is no earlier output of a builder: a folder that
    holds an input (`--out` the folder of the pairs, or the tools folder) or a folder of anything else (`--out runs`).
    Checked before the build, so a long one is not spent first. An empty folder, or a saved dataset
    (`dataset_dict.json`), is replaced as the help says."""
    if problem := out_folder_problem(out):  # found after the whole build, as a raw OSError naming its staging folder
        raise ValueError(problem)
    folder = Path(out).resolve()
    for given in inputs:
        path = Path(given).resolve()
        if path == folder or folder in path.parents:
            raise ValueError(f"--out {out} holds the input {given}: replacing it would delete that")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "dataset_dict.json").is_file():
        raise ValueError(
            f"--out {out} is a folder of something else (no dataset_dict.json of an earlier build): replacing it "
            "would delete it; give a new folder"
        )


# ------------------------------------------------------------------------------------------- simulator
def simulator_sft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", nargs="+", default=[], help="Pair JSONL files (the schema of shared/data/pairs).")
    parser.add_argument(
        "--stabletoolbench-cache",
        nargs="+",
        default=[],
        metavar="FOLDER",
        help="StableToolBench cache folders (<cat>/<tool>_for_<cat>/<api>.json).",
    )
    parser.add_argument(
        "--alpaca",
        nargs="+",
        default=[],
        metavar="FILE",
        help="MirrorAPI-style alpaca files (system/instruction/output; JSON list or JSONL).",
    )
    parser.add_argument(
        "--tools",
        nargs="+",
        default=[],
        metavar="SOURCE",
        help="Tools folders / query files with the docs of the pairs' APIs.",
    )
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--system-prompt-file", help="System prompt for the stabletoolbench formats.")
    add_settings_arguments(parser, SimulatorDataOptions, exclude=("system_prompt",))


def build_simulator_sft(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not (args.pairs or args.stabletoolbench_cache or args.alpaca):
        raise ValueError("give at least one of --pairs, --stabletoolbench-cache, --alpaca")
    if (args.pairs or args.stabletoolbench_cache) and not args.tools:
        raise ValueError("--pairs and --stabletoolbench-cache need --tools (the API docs)")
    _check_out(args.out, [*args.pairs, *args.stabletoolbench_cache, *args.alpaca, *args.tools])
    start = time.perf_counter()
    bad: list[str] = []
    given: dict = {}
    if args.history and (args.prompt_format or DEFAULT_SIMULATOR_FORMAT) in (
        DEFAULT_SIMULATOR_FORMAT,
        STRUCTURED_FORMAT,
    ):
        given["prompt_format"] = session_format(args.prompt_format or DEFAULT_SIMULATOR_FORMAT)
    if args.system_prompt_file:
        given["system_prompt"] = open(args.system_prompt_file, encoding="utf-8").read()
    options = settings_from_args(args, SimulatorDataOptions, **given)
    options.check()
    # The inputs' paths are checked (each reader does so when called) before the tools load: seconds for ToolEnv2404
    sources = [read_pairs_jsonl(p, bad.append) for p in args.pairs]
    sources += [read_stabletoolbench_cache(f, bad.append) for f in args.stabletoolbench_cache]
    sources += [read_alpaca(f, bad.append) for f in args.alpaca]
    registry = ToolRegistry.load(args.tools)
    splits, stats = build_simulator_records(itertools.chain(*sources), registry, options, progress=True)
    if not any(splits.values()):  # before --out is replaced: an empty set would take the place of a good one
        dropped = ", ".join(f"{n:,} {why}" for why, n in stats["dropped"].items() if isinstance(n, int) and n)
        reason = f"no pair kept of {stats['read']['total']:,} read" + (f" (dropped: {dropped})" if dropped else "")
        raise ValueError(f"{reason}; {len(bad):,} unreadable line(s), e.g. {bad[0]}" if bad else reason)
    _note_unreadable(
        stats,
        bad,
        {
            "pairs": args.pairs,
            "stabletoolbench_cache": args.stabletoolbench_cache,
            "alpaca": args.alpaca,
            "tools": args.tools,
        },
    )
    stats["build_seconds"] = round(time.perf_counter() - start, 2)
    write_sft_dataset(args.out, splits, stats)
    print(_summary(args.out, stats, start, kept=stats["kept"]))
    return 0


# ------------------------------------------------------------------------------------------- judge
def judge_sft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labelled", nargs="+", required=True, help="Labelled answer JSONL files.")
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--prompt-format", default="fac-v1", choices=TRAINABLE_JUDGE_FORMATS)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="Share of queries held out (test).")
    parser.add_argument(
        "--balance",
        default="drop",
        choices=BALANCE_RULES,
        help="How the training split's verdicts are balanced: drop, the more frequent verdict's answers dropped "
        "(before --repeat-sources; the shipped judge's data); per-source, the rarer verdict's answers of each "
        "source repeated until both weigh the same there (after --repeat-sources; nothing dropped); none.",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--split-rule",
        default="shuffled",
        choices=SPLIT_RULES,
        help="How the held-out queries are drawn (mirrorapi.splits): shuffled, the shipped judge's split, or "
        "grouped, queries that share an answer's text held out together, each group its own seeded draw.",
    )
    parser.add_argument(
        "--repeat-sources",
        nargs="+",
        default=[],
        metavar="SOURCE=N",
        help="Repeat the training records of a source N times, after balancing (e.g. tau-bench/airline=4): "
        "AnyToolBench's 810 labels would otherwise drown tau-bench's 152, the harder ones.",
    )


def build_judge_sft(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _check_out(args.out, args.labelled)
    start = time.perf_counter()
    bad: list[str] = []
    # A label neither verdict is a bad line (its file and line said), as judge agreement reads the same files.
    verdicts = JUDGE_VERDICTS.get(args.prompt_format)
    records = itertools.chain(*[read_labelled(path, bad.append, verdicts) for path in args.labelled])
    try:
        splits, stats = build_judge_records(
            records,
            args.prompt_format,
            args.test_fraction,
            args.balance,
            args.seed,
            args.repeat_sources,
            args.split_rule,
        )
    except ValueError as exc:  # before --out is replaced: an empty set would take the place of a good one
        raise ValueError(f"{exc}; {len(bad):,} unreadable line(s), e.g. {bad[0]}" if bad else str(exc)) from None
    _note_unreadable(stats, bad, {"labelled": args.labelled})
    write_sft_dataset(args.out, splits, stats, JUDGE_COLUMNS)
    print(_summary(args.out, stats, start))
    return 0


BUILD_SIMULATOR_SFT = Command(
    "build-simulator-sft",
    "Build the simulator's SFT dataset from real request -> response pairs and tool docs.",
    simulator_sft_arguments,
    build_simulator_sft,
    USER_ERRORS,
)
BUILD_JUDGE_SFT = Command(
    "build-judge-sft",
    "Build the judge's SFT dataset from labelled final answers.",
    judge_sft_arguments,
    build_judge_sft,
    USER_ERRORS,
)


def register(sub) -> None:
    """The data stage's subcommands of `mirrorapi`."""
    add_group(sub, "data", "Build SFT datasets (the commands of data/*.py).", [BUILD_SIMULATOR_SFT, BUILD_JUDGE_SFT])
