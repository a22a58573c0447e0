"""The evaluation stage's commands: `mirrorapi benchmark` and `mirrorapi eval fac | sowr | judge-agreement |
simulator | run-agent | apibank | tooleyes`, which the scripts eval/*.py run alone (their docstring is
their usage). The agent's and the judge's flags are the fields of AgentSettings and JudgeSettings.

Exit statuses: 0 done, 1 some queries or judge calls failed (a rerun retries them), 2 bad input or an
engine or server that does not answer; every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mirrorapi.command_line import (
    Command,
    SettingsError,
    add_command,
    add_group,
    add_settings_arguments,
    out_folder_problem,
    settings_from_args,
)
from mirrorapi.evaluation.agent.settings import METHODS, AgentRunError, AgentSettings
from mirrorapi.evaluation.answers.items import AnswersError
from mirrorapi.evaluation.fidelity.settings import FidelitySettings
from mirrorapi.evaluation.judge.scoring import JUDGE_METRICS, JudgeRunError, JudgeSettings

USER_ERRORS = (ValueError, AnswersError, JudgeRunError)


def _out_problem(out: str | Path | None) -> str | None:
    """An --out that cannot be a folder, found before any judge or engine call rather than after them all."""
    return None if out is None else out_folder_problem(out)


def _count_problem(args: argparse.Namespace) -> str | None:
    """A count flag below 1, said in one line (a --limit of 0 once meant every query and -1 all but each group's
    last; --rounds and --repeats of 0 meant 1)."""
    for name in ("limit", "rounds", "repeats"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            return f"--{name} must be at least 1, got {value}"
    return None


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"{args.prog}: error: {message}", file=sys.stderr)
    return 2


def _judge_failures(failures: list[str]) -> int:
    if not failures:
        return 0
    print(
        f"{len(failures)} judge call(s) failed, e.g. {failures[0]}; rerun the same command to retry them.",
        file=sys.stderr,
    )
    return 1


def _log_to_stderr() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")


def _no_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")


# ------------------------------------------------------------------------------------------- FAC / SoPR
def fac_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--answers", required=True, help="A converted answer file <model>/<group>.json, or a folder.")
    parser.add_argument("--ids", required=True, help="A test_query_ids (or test_instruction) file, or a folder.")
    add_settings_arguments(parser, JudgeSettings)
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--metric", choices=sorted(JUDGE_METRICS), default="fac", help="fac (default) or sopr.")
    parser.add_argument("--repeats", type=int, default=1, help="Judge each answer N times; mean ± std (default 1).")
    parser.add_argument("--overwrite", action="store_true", help="Drop this metric's earlier verdicts in --out.")
    _no_progress(parser)


def fac(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.judge.scoring import run_scoring

    _log_to_stderr()
    if problem := _count_problem(args) or _out_problem(args.out):
        return _fail(args, problem)
    try:
        run = run_scoring(
            args.answers,
            args.ids,
            settings_from_args(args, JudgeSettings),
            args.out,
            metric=args.metric,
            repeats=args.repeats,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except USER_ERRORS as exc:
        return _fail(args, str(exc))
    print((Path(args.out) / f"{args.metric}.md").read_text(encoding="utf-8"))
    return _judge_failures(run.failures)


# ------------------------------------------------------------------------------------------- SoWR
def sowr_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", required=True, help="The reference model's converted answers (one model).")
    parser.add_argument("--candidate", required=True, nargs="+", help="Candidate answers (files or folders).")
    parser.add_argument("--ids", required=True, help="A test_query_ids (or test_instruction) file, or a folder.")
    add_settings_arguments(parser, JudgeSettings)
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--rounds", type=int, default=3, help="Evaluations per query; majority wins (default 3).")
    parser.add_argument(
        "--overwrite", action="store_true", help="Drop earlier SoPR verdicts and preferences in --out."
    )
    _no_progress(parser)


def sowr(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.judge.sowr import run_sowr

    if problem := _count_problem(args) or _out_problem(args.out):
        return _fail(args, problem)
    try:
        run = run_sowr(
            args.reference,
            args.candidate,
            args.ids,
            settings_from_args(args, JudgeSettings),
            args.out,
            rounds=args.rounds,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except USER_ERRORS as exc:
        return _fail(args, str(exc))
    print((Path(args.out) / "sowr.md").read_text(encoding="utf-8"))
    return _judge_failures(run.failures)


# ------------------------------------------------------------------------------------------- judge agreement
def judge_agreement_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--labelled", required=True, nargs="+", metavar="FILE.jsonl", help="Labelled answers in the judge schema."
    )
    add_settings_arguments(parser, JudgeSettings)
    parser.add_argument("--out", default="runs/judge-agreement", help="Output folder (default runs/judge-agreement).")
    parser.add_argument("--limit", type=int, default=None, help="Judge only the first N records of each source.")
    _no_progress(parser)


def judge_agreement(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.judge.agreement import render_markdown, run_agreement

    _log_to_stderr()
    if problem := _count_problem(args) or _out_problem(args.out):
        return _fail(args, problem)
    try:
        report, failures = run_agreement(
            args.labelled,
            settings_from_args(args, JudgeSettings),
            args.out,
            limit=args.limit,
            progress=not args.no_progress,
        )
    except USER_ERRORS as exc:
        return _fail(args, str(exc))
    print(render_markdown(report))
    return _judge_failures(failures)


# ------------------------------------------------------------------------------------------- fidelity
def fidelity_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, FidelitySettings)
    _no_progress(parser)


def fidelity(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.fidelity.metrics import FidelityError
    from mirrorapi.evaluation.fidelity.replay import run_fidelity

    _log_to_stderr()
    if problem := _out_problem(args.out):
        return _fail(args, problem)
    try:
        run_fidelity(settings_from_args(args, FidelitySettings), progress=not args.no_progress)
    except (FidelityError, SettingsError) as exc:
        return _fail(args, str(exc))
    print((Path(args.out) / "fidelity.md").read_text(encoding="utf-8"))
    return 0


# ------------------------------------------------------------------------------------------- agent runs
def _query_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queries",
        required=True,
        help="A StableToolBench query file (test_instruction/<group>.json) or a folder of them.",
    )
    parser.add_argument(
        "--tools",
        nargs="*",
        default=[],
        metavar="FOLDER",
        help="Tools folder(s) with the tool docs (the server's tools_folder); the queries' own "
        "api_list fills what they lack. Without it, only the api_list docs are used.",
    )
    parser.add_argument("--limit", type=int, default=None, help="Only the first N queries of each group.")
    _no_progress(parser)


def run_agent_arguments(parser: argparse.ArgumentParser) -> None:
    _query_arguments(parser)
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    add_settings_arguments(parser, AgentSettings)


def run_agent(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.agent.run import run_agent as run

    if problem := _count_problem(args):
        return _fail(args, problem)
    try:
        result = run(
            args.queries,
            settings_from_args(args, AgentSettings),
            args.out,
            tools=args.tools,
            progress=not args.no_progress,
            limit=args.limit,
        )
    except (AgentRunError, ValueError, OSError) as exc:
        return _fail(args, str(exc))
    print(
        f"{result.done} queries answered, {result.skipped} done before, {len(result.failures)} failed "
        f"({result.seconds:.1f} s); converted: {', '.join(str(p) for p in result.converted.values()) or 'none'}"
    )
    if result.failures:
        print(
            f"incomplete: {len(result.failures)} queries failed (listed above); rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


# ------------------------------------------------------------------------------------------- benchmark
AGENT_FIELDS = ("base_urls", "model", "method")  # given per --agent and per row, not as flags


def benchmark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        nargs="+",
        action="append",
        required=True,
        metavar="LABEL MODEL BASE_URL",
        help="An agent model: a row label, its model name and base URL(s). Repeat for more.",
    )
    parser.add_argument(
        "--agent-format",
        nargs=2,
        action="append",
        default=[],
        metavar=("LABEL", "FORMAT"),
        help="The prompt format of one --agent (by its label), e.g. --agent-format smollm2 "
        "agent-react-v1; the others use --prompt-format.",
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help=f"Default: {' '.join(METHODS)}.")
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--ids", default=None, help="Test ids (test_query_ids); default: the queries' ids.")
    parser.add_argument(
        "--reference",
        default=None,
        help="SoWR reference row, <label>_<cot|dfs> (default: the first agent's first method).",
    )
    parser.add_argument("--repeats", type=int, default=3, help="SoPR / SoWR rounds (default 3, as StableToolBench).")
    _query_arguments(parser)
    add_settings_arguments(parser, AgentSettings, exclude=AGENT_FIELDS)
    add_settings_arguments(parser, JudgeSettings, prefix="judge-")


def benchmark(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.benchmark import parse_agents, run_benchmark

    if problem := _count_problem(args):
        return _fail(args, problem)
    try:
        agents = parse_agents(args.agent, args.agent_format)
        template, *_ = [
            settings_from_args(
                args, AgentSettings, base_urls=agents[0].base_urls, model=agents[0].model, method=method
            )
            for method in args.methods
        ]  # every method checked before the first row runs
        judge = settings_from_args(args, JudgeSettings, prefix="judge-")
        result = run_benchmark(
            args.queries,
            agents,
            args.methods,
            template,
            judge,
            args.out,
            ids=args.ids,
            tools=args.tools,
            reference=args.reference,
            repeats=args.repeats,
            progress=not args.no_progress,
            limit=args.limit,
        )
    except (*USER_ERRORS, AgentRunError) as exc:
        return _fail(args, str(exc))
    print(result.report.read_text(encoding="utf-8"))
    if not result.complete:
        failed = sum(len(run.failures) for run in result.agent_runs.values())
        print(
            f"incomplete: {failed} queries and {len(result.judge_failures)} judge calls failed; rerun the same "
            "command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


# ------------------------------------------------------------------------------------------- API-Bank, ToolEyes
# Their flags are built by their own modules' `parser` (mirrorapi/evaluation/benchmarks/apibank/scoring.py,
# benchmarks/tooleyes.py), from their settings' fields like every other command's: these commands hand them the
# arguments as given.
def apibank_command(argv: list[str] | None, usage: str | None = None, prog: str | None = None) -> int:
    import asyncio

    import aiohttp

    from mirrorapi.evaluation.benchmarks import apibank

    cli = apibank.parser(usage, prog)
    args = cli.parse_args(argv)
    args.prog = cli.prog
    if problem := _out_problem(args.out):
        return _fail(args, problem)
    try:
        if args.write_pairs:
            count = apibank.write_pairs_from(args)
            print(f"{count} recorded calls -> {args.write_pairs}")
            return 0
        settings = apibank.settings_from(args)
        rows = apibank.evaluate(settings)
    except (ValueError, OSError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
        return _fail(args, str(exc))
    apibank.write_report(rows, settings, args.out)
    print((args.out / "report.md").read_text(encoding="utf-8"))
    return 0


def tooleyes_command(argv: list[str] | None, usage: str | None = None, prog: str | None = None) -> int:
    from mirrorapi.evaluation.benchmarks import tooleyes

    cli = tooleyes.parser(usage, prog)
    args = cli.parse_args(argv)
    args.prog = cli.prog
    if problem := _out_problem(args.out):
        return _fail(args, problem)
    try:
        judge = tooleyes.judge_from(args)
        result = tooleyes.score(args.answers, judge)
    except (ValueError, AnswersError) as exc:
        return _fail(args, str(exc))
    print(tooleyes.write_report(result, judge, args.out).read_text(encoding="utf-8"))
    return 1 if result.unrated else 0


# ------------------------------------------------------------------------------------------- registry
FAC = Command("fac", "Score final answers with an open judge: FAC (default) or SoPR.", fac_arguments, fac)
SOWR = Command(
    "sowr", "SoWR: win rate of candidate answers against a reference's, with an open judge.", sowr_arguments, sowr
)
JUDGE_AGREEMENT = Command(
    "judge-agreement",
    "How well a judge agrees with labelled final answers.",
    judge_agreement_arguments,
    judge_agreement,
)
FIDELITY = Command(
    "simulator",
    "A virtual server's fidelity: replay real held-out calls, compare the answers.",
    fidelity_arguments,
    fidelity,
)
RUN_AGENT = Command(
    "run-agent",
    "Run a tool-calling model on StableToolBench queries against /virtual.",
    run_agent_arguments,
    run_agent,
)
# Called as `mirrorapi eval apibank`: their own parsers name themselves so and show the command's help.
_APIBANK_HELP = "API-Bank level-1 and level-2 API-call accuracy on the virtual server."
APIBANK = Command(
    "apibank",
    _APIBANK_HELP,
    lambda parser: None,
    lambda args: apibank_command(args.passthrough, _APIBANK_HELP, args.prog),
    passthrough=True,
)
_TOOLEYES_HELP = "ToolEyes' capability scores of agent trajectories."
TOOLEYES = Command(
    "tooleyes",
    _TOOLEYES_HELP,
    lambda parser: None,
    lambda args: tooleyes_command(args.passthrough, _TOOLEYES_HELP, args.prog),
    passthrough=True,
)
BENCHMARK = Command(
    "benchmark",
    "Agents x methods on /virtual, then SoPR, SoWR and FAC in one report.",
    benchmark_arguments,
    benchmark,
    description=(
        "Run every --agent with every --method against the virtual server, score the answers "
        "(SoPR, SoWR against --reference, FAC) with the judge and write <out>/report.md (+ .json, "
        ".png). Reruns resume."
    ),
)


def register(sub) -> None:
    """The evaluation stage's subcommands of `mirrorapi`."""
    add_command(sub, BENCHMARK)
    add_group(
        sub,
        "eval",
        "Score agents, judges and simulators (the commands of eval/*.py).",
        [RUN_AGENT, FAC, SOWR, JUDGE_AGREEMENT, FIDELITY, APIBANK, TOOLEYES],
    )
