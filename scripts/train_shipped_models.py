"""Train the simulator and the judge mirrorapi ships (LoRA adapters on SmolLM2-135M-Instruct) on every shared real
pair and label, in one run of a lent GPU machine; or on a tiny slice on the CPU, to check the path.

    # here, where ../shared/data is: the SFT sets (the data builders' splits: held-out APIs and episodes stay out)
    .venv/bin/python scripts/train_shipped_models.py --stage data --work runs/shipped
    # on the GPU machine (docs/training.md, "One call of a lent machine: what to carry and run": the data, the
    # base GGUF in parts and the wheels carried; python3 with PYTHONPATH=/tmp/site:$PWD)
    python3 scripts/train_shipped_models.py --stage train --work runs/shipped --base-gguf BASE.gguf --out "$OUT"
    # the shipped simulator's answers as a virtual server asks its engine (response_format), then scored (CPU)
    .venv/bin/python scripts/train_shipped_models.py --stage answer --work runs/shipped --engine URL \
        --engine-model NAME --max-new-tokens 1024
    .venv/bin/python scripts/train_shipped_models.py --stage score --work runs/shipped
    # a simulator adapter's failure decision as a probability on the answer stage's records (ROC AUC, thresholds)
    .venv/bin/python scripts/train_shipped_models.py --stage decisions --work runs/shipped --base BASE --adapter DIR
    # a judge adapter trained elsewhere (e.g. on the CPU), scored on the same split as the train stage scores it
    .venv/bin/python scripts/train_shipped_models.py --stage judge --work runs/shipped --base BASE --adapter DIR
    # the whole path on the CPU, on a slice, with the tiny model (what tests/training/test_train_shipped.py runs)
    .venv/bin/python scripts/train_shipped_models.py --tiny --base runs/tiny-base --work runs/shipped-tiny

`--stage all` (the default) runs both stages where it is. The data stage runs on the CPU before a GPU run because
the shared data does not travel to the GPU machine and the build is single-threaded Python: the GPU's minutes go
to what only a GPU does. The train stage:
1. the base model: `--base DIR` (a `mirrorapi models get` folder), or `--base-gguf FILE` converted as `models get`
   converts it (mirrorapi.models.from_gguf);
2. training/sft.py under `accelerate launch`, simulator and judge at once (two processes on one GPU: a 135M model
   leaves most of it idle), recipes `training/configs/{simulator,judge}_smollm2_gpu_lora.yaml`, each stopped by
   its own `max_train_seconds`;
3. offline scores of the trained weights on held-out records, with the records' own prompts: the judge's verdict
   as the likelier of the two verdict lines (and the untrained base's, beside it), the simulator's greedy
   answers to a sample of held-out calls of every source (scored on the CPU afterwards against the real answers
   and the nearest example: `--stage score`), and its failure decision on the same calls as a probability (ROC
   AUC and what a threshold on it would answer: `failure_decisions`);
4. `--out`: at most 8 files, none over 16 MiB and none deeper than 2 folders (what a lent machine hands back):
   `report.json` (throughput, MFU, eval losses, wall times, the GPU), the two adapters as tar files, the
   generations, the failure decisions, the judge's scores, the logs.

Each stage is a module of `scripts/shipped_steps/`; this script parses the arguments and runs the stage asked for.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from shipped_steps.answer import HELD_OUT_SPLITS, answer_stage
from shipped_steps.common import REPO, SHARED, StageError, log
from shipped_steps.data import build_data
from shipped_steps.decisions import decision_stage
from shipped_steps.judge import judge_stage
from shipped_steps.score import score_generations, score_lines
from shipped_steps.train import train_stage

from mirrorapi.data.judge_sft import BALANCE_RULES
from mirrorapi.few_shot import FEW_SHOT_TIES
from mirrorapi.prompts.simulator_formats import HISTORY_RULES
from mirrorapi.splits import SPLIT_RULES


def refuse_what_cannot_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2, one line) for a stage without what it needs."""
    if args.stage == "answer" and args.engine:
        if not args.engine_model:
            parser.error("--engine needs --engine-model NAME (the model name that engine answers to)")
    elif args.stage in ("all", "train", "answer", "decisions", "judge") and not (args.base or args.base_gguf):
        parser.error(f"the {args.stage} stage needs --base DIR or --base-gguf FILE (or, to answer, --engine URL)")
    if args.stage == "answer" and not (args.adapter or args.engine):
        parser.error("the answer stage needs --adapter DIR, or --engine URL")
    if args.session_failure_rule != "any" and not (args.engine and args.history_twins):
        parser.error(
            f"--session-failure-rule {args.session_failure_rule} needs --engine URL and --history-twins (a call's "
            "answer alone)"
        )
    if args.stage == "judge" and not args.adapter:
        parser.error("the judge stage needs --adapter DIR (a judge adapter)")
    if args.stage == "decisions" and not args.adapter:
        parser.error("the decisions stage needs --adapter DIR (a simulator adapter)")


def usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line on stderr and exit status 2: a mistake in what was asked, before anything runs."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def default_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--pairs, --tools and --labelled not given: every shared file (../shared/data), or with --tiny the samples
    (data/samples). Without ../shared and without --tiny a stage that reads them is refused: it would train or
    score on the samples as if they were the shared data."""
    samples = REPO / "data" / "samples"
    if args.tiny:
        args.pairs = args.pairs or [str(samples / "pairs.jsonl")]
        args.tools = args.tools or [str(samples / "tools")]
        args.labelled = args.labelled or [str(samples / "judge.jsonl")]
        return
    if SHARED.is_dir():
        args.pairs = args.pairs or [str(p) for p in sorted((SHARED / "pairs").glob("*.jsonl"))]
        args.tools = args.tools or [str(SHARED / "toolenv" / "realtools")]
        args.labelled = args.labelled or [str(SHARED / "judge" / "labelled.jsonl")]
        return
    every = ("pairs", "tools", "labelled")
    needed = {"data": every, "all": every, "score": ("pairs", "tools")}
    if args.stage == "answer" and args.engine:
        needed["answer"] = ("tools",)  # the server's tool docs
    missing = [f"--{name}" for name in needed.get(args.stage, ()) if not getattr(args, name)]
    if missing:
        usage_error(
            parser,
            f"the {args.stage} stage reads the shared data and {SHARED} is not there: give {' '.join(missing)} "
            "(or --tiny for the few samples of data/samples, to check the path)",
        )


def check_recipe_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--simulator-set and --judge-set checked before anything trains, against the keys training/sft.py takes (its
    own parser: mirrorapi.training.recipe.make_parser) and each value against its key's type: a wrong one would
    otherwise fail only in the training process, after the other kind's training and its imports."""
    if args.stage not in ("all", "train") or not (args.simulator_set or args.judge_set):
        return
    try:
        from mirrorapi.training.recipe import make_parser

        keys = make_parser()._option_string_actions
    except ImportError as exc:
        usage_error(parser, f"the train stage needs TRL and PEFT importable here ({exc})")
    for flag, settings in (("--simulator-set", args.simulator_set), ("--judge-set", args.judge_set)):
        for entry in settings:
            key, sep, value = entry.partition("=")
            action = keys.get(f"--{key}")
            if not sep or not key:
                usage_error(parser, f"{flag} takes KEY=VALUE, got {entry!r}")
            if action is None:
                usage_error(parser, f"{flag} {entry}: training/sft.py has no key {key!r} (`training/sft.py --help`)")
            if callable(action.type) and action.nargs not in ("+", "*"):
                try:
                    action.type(value)
                except (TypeError, ValueError, argparse.ArgumentTypeError):
                    usage_error(parser, f"{flag} {entry}: {value!r} is not a valid value of {key}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument(
        "--stage",
        choices=("all", "data", "train", "answer", "decisions", "score", "judge"),
        default="all",
        help="answer: an adapter's greedy answers to the held-out sample, without training (--adapter); "
        "score: the generations of a train or answer stage (--generations), on the CPU, after it; "
        "judge: a judge adapter's verdicts on the held-out answers, scored as the train stage scores them "
        "(--adapter); decisions: a simulator adapter's probability of answering a failure on the records the "
        "answer stage asks, against the real outcomes: ROC AUC and the failures a threshold would answer "
        "(--adapter).",
    )
    parser.add_argument(
        "--adapter",
        help="The simulator adapter the answer and decisions stages ask, or the judge adapter the judge stage scores.",
    )
    parser.add_argument(
        "--engine",
        help="Or the answer stage asks the simulator an OpenAI-compatible engine serves at this URL (.../v1), as the "
        "virtual server asks it: e.g. scripts/serve_engine_cpu.sh on a `models get` folder.",
    )
    parser.add_argument("--engine-model", help="The model name that engine answers to (with --engine).")
    parser.add_argument(
        "--structured-output",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="With --engine: send the server's response_format (its structured_output, on by default).",
    )
    parser.add_argument(
        "--history-twins",
        action="store_true",
        help="The answer stage also asks each sampled call in a session without its history (the same call's "
        "stateless record), and the score stage reports both on the same calls against the same real answers.",
    )
    parser.add_argument(
        "--session-failure-rule",
        choices=["any", "related", "alone"],
        default="any",
        help="With --engine and --history-twins: the server's session_failure_rule (related: a session answer that "
        "is a failure, none of whose shown calls is related to the call, is replaced by its twin's answer, as a "
        "server so set answers it; alone: every session answer that is a failure where its twin's is none; the row "
        "keeps the session's own as `session_generated`).",
    )
    parser.add_argument(
        "--generations",
        help="generations.jsonl.xz of a train or answer stage (--stage score; default the train stage's, "
        "WORK/out/generations.jsonl.xz, or --out's).",
    )
    parser.add_argument("--work", required=True, help="Work folder: data/, base/, the runs, logs/.")
    parser.add_argument(
        "--out",
        help="Where the results go; on a lent machine, $OUT. Default: each stage its own folder of WORK (train: "
        "out, answer: answers, decisions: decisions, judge: judge-scores), so that one does not overwrite another's.",
    )
    parser.add_argument(
        "--pack",
        metavar="FILE.tar",
        help="Also keep the stage's results as this one tar file (each file under a folder named after it), "
        "rewritten whole as each result lands: for several runs in one call of a lent machine, whose $OUT hands "
        'back at most 8 files (e.g. --pack "$OUT/seed1.tar", --out left in WORK). The limits are then checked '
        "over all of $OUT.",
    )
    parser.add_argument("--base", help="Base model folder (mirrorapi models get smollm2-135m-instruct).")
    parser.add_argument("--base-gguf", help="Or the base's GGUF file, converted here as `models get` converts it.")
    parser.add_argument("--pairs", nargs="+", help="Pair files (default: every ../shared/data/pairs file).")
    parser.add_argument("--tools", nargs="+", help="Tool docs (default ../shared/data/toolenv/realtools).")
    parser.add_argument(
        "--labelled", nargs="+", help="Labelled answers (default ../shared/data/judge/labelled.jsonl)."
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=("simulator", "judge"),
        default=["simulator", "judge"],
        help="Which models the train stage trains (e.g. only the simulator, trained further from the shipped "
        "adapter: --simulator-set init_adapter=DIR).",
    )
    parser.add_argument(
        "--repeat-failures",
        type=int,
        default=1,
        help="The data stage: the simulator's failed training calls N times (the shipped simulator's second "
        "stage: 2; docs/training.md).",
    )
    parser.add_argument(
        "--target-response-chars",
        type=int,
        default=1024,
        help="The data stage: longer training answers shrunk to about this many characters, JSON kept valid (the "
        "first two stages: 1024; the third: 2048, the server's longest answer; docs/training.md).",
    )
    parser.add_argument(
        "--few-shot-ties",
        choices=FEW_SHOT_TIES,
        default="shortest",
        help="The data stage: which of the equally similar examples a prompt shows (the shipped simulator: "
        "shortest; median scored higher for a model trained with it, docs/training.md). The trained record names "
        "it, so a server shows the model the examples it learnt from.",
    )
    parser.add_argument(
        "--few-shot-char-budget",
        type=int,
        default=1024,
        help="The data stage: most characters of examples per prompt (the shipped simulator trained on 1024).",
    )
    parser.add_argument(
        "--few-shot-response-chars",
        type=int,
        default=600,
        help="The data stage: each example's response shrunk to this many characters, 0 whole (the shipped "
        "simulator trained on 600 and is served with 2000 within 3000, the examples whole: its record's "
        "server_settings; held-out records built so are asked as it is served, docs/training.md).",
    )
    parser.add_argument(
        "--history-rule",
        choices=HISTORY_RULES,
        default="recent",
        help="The data stage: which of a session's earlier calls a prompt shows, every one (the shipped simulator's "
        "data) or those related to the call (docs/training.md). The trained record names it, so a server shows the "
        "model the history it learnt from.",
    )
    parser.add_argument(
        "--without-examples-share",
        type=float,
        default=0.0,
        help="The data stage: share of the simulator's training calls shown without their example, as a server "
        "asks a call of an API it has no example of (docs/training.md, the fifth run).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=42,
        help="The data stage: the seed of both splits (the shipped models': 42; seed 1 holds out 32 of tau-bench's "
        "failures, seed 42 none; docs/training.md).",
    )
    parser.add_argument(
        "--split-rule",
        choices=SPLIT_RULES,
        default="shuffled",
        help="The data stage: how both splits draw their held-out side (mirrorapi.splits): shuffled, the shipped "
        "models' split, or grouped, the next run's (each episode's and query's side its own seeded draw, twin APIs "
        "and a task's trials together, no held-out answer text in the judge's training; docs/training.md).",
    )
    parser.add_argument(
        "--judge-test-fraction",
        type=float,
        default=0.1,
        help="The data stage: share of the judge's queries held out (the shipped judge: 0.1; 0.3 holds out more of "
        "tau-bench's few).",
    )
    parser.add_argument(
        "--judge-balance",
        choices=BALANCE_RULES,
        default="drop",
        help="The data stage: how the judge's training verdicts are balanced (data/build_judge_sft.py --balance): "
        "drop, the shipped judge's, or per-source, each source's rarer verdict repeated, the next run's "
        "(docs/training.md).",
    )
    parser.add_argument("--tiny", action="store_true", help="A few steps on data/samples: checks the path on a CPU.")
    parser.add_argument(
        "--per-stratum",
        type=int,
        default=120,
        help="Held-out records per (split, source, prompt format) to generate for.",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=(*HELD_OUT_SPLITS, "test_ood_shown"),
        default=list(HELD_OUT_SPLITS),
        help="The answer stage's held-out splits; test_ood_shown: unseen APIs' calls shown an example of their API "
        "(the data stage's other half of test_ood's episodes), scored apart (docs/training.md).",
    )
    parser.add_argument(
        "--sources",
        nargs="+",
        help="The answer stage asks only the sampled records of these sources (e.g. tau-bench api-bank "
        "toolbench-example: with --per-stratum above their size, every held-out call of the small sources).",
    )
    parser.add_argument("--generate-seconds", type=float, default=90.0)
    parser.add_argument("--answers", type=int, help="At most this many of the sample (its first ones).")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=320,
        help="Tokens per answer. A server's max_tokens: 1024 by default, or what a model's record names (the shipped "
        "simulator's: 576).",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--simulator-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Recipe keys for the simulator's run, e.g. max_train_seconds=200.",
    )
    parser.add_argument(
        "--judge-set", nargs="+", default=[], metavar="KEY=VALUE", help="Recipe keys for the judge's run."
    )
    args = parser.parse_args(argv)
    default_inputs(parser, args)
    refuse_what_cannot_run(parser, args)
    check_recipe_settings(parser, args)
    try:
        return run_stages(args)
    except StageError as exc:
        usage_error(parser, str(exc))


def run_stages(args: argparse.Namespace) -> int:
    work = Path(args.work)
    if args.tiny:
        args.per_stratum, args.max_new_tokens, args.batch_size = 2, 16, 4
    if args.stage in ("all", "data"):
        built = build_data(
            work,
            args.pairs,
            args.tools,
            args.labelled,
            args.repeat_failures,
            args.target_response_chars,
            args.few_shot_ties,
            args.few_shot_char_budget,
            args.few_shot_response_chars,
            args.history_rule,
            args.without_examples_share,
            args.seed,
            args.split_rule,
            args.judge_test_fraction,
            args.judge_balance,
        )
        log(f"data: {json.dumps(built)}")
    if args.stage in ("all", "train"):
        report = train_stage(args, work)
        log(f"done: {json.dumps({k: report[k] for k in ('seconds', 'machine')})}")
    if args.stage == "answer":
        log(f"done: {json.dumps(answer_stage(args, work))}")
    if args.stage == "judge":
        log(f"done: {json.dumps(judge_stage(args, work))}")
    if args.stage == "decisions":
        log(f"done: {json.dumps(decision_stage(args, work))}")
    if args.stage in ("all", "score"):
        generations = Path(args.generations or Path(args.out or work / "out") / "generations.jsonl.xz")
        scores = score_generations(generations, work, args.pairs, args.tools)
        (generations.parent / "fidelity-offline.json").write_text(
            json.dumps(scores, indent=2) + "\n", encoding="utf-8"
        )
        log(f"scores: {generations.parent / 'fidelity-offline.json'}")
        for line in score_lines(scores):
            log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
