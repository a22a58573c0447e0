"""Command-line arguments shared by the eval scripts and `mirrorapi benchmark` (one definition each)."""

from __future__ import annotations

import argparse

from mirrorapi.evaluation.agent.settings import METHODS, AgentSettings, check_method
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.prompts.agent_formats import AGENT_FORMATS, DEFAULT_AGENT_FORMAT


def add_agent_arguments(parser: argparse.ArgumentParser, single_model: bool = True) -> None:
    parser.add_argument("--queries", required=True,
                        help="A StableToolBench query file (test_instruction/<group>.json) or a folder of them.")
    parser.add_argument("--server", required=True, help="The /virtual URL, e.g. http://127.0.0.1:8080/virtual.")
    parser.add_argument("--tools", nargs="*", default=[], metavar="FOLDER",
                        help="Tools folder(s) with the tool docs (the server's tools_folder); the queries' own "
                             "api_list fills what they lack. Without it, only the api_list docs are used.")
    if single_model:
        parser.add_argument("--base-url", required=True, nargs="+", metavar="URL",
                            help="OpenAI-compatible base URL(s) of the agent model, e.g. http://127.0.0.1:8000/v1.")
        parser.add_argument("--model", required=True, help="The agent's model name on that engine.")
        parser.add_argument("--method", default="CoT@1", help=f"{' or '.join(METHODS)} (default CoT@1).")
        parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--prompt-format", choices=AGENT_FORMATS, default=DEFAULT_AGENT_FORMAT,
                        help="agent-v1: the functions go to the engine as OpenAI tools and the model answers with "
                             "tool calls; agent-react-v1: a text protocol (Thought / Action / Action Input) for "
                             "models whose engine cannot pass tool calls, e.g. SmolLM2 (default agent-v1)."
                             + ("" if single_model else " --agent-format sets it per agent."))
    if not single_model:
        parser.add_argument("--agent-format", nargs=2, action="append", default=[], metavar=("LABEL", "FORMAT"),
                            help="The prompt format of one --agent (by its label), e.g. --agent-format smollm2 "
                                 "agent-react-v1; the others use --prompt-format.")
    parser.add_argument("--react-grammar", action="store_true",
                        help="agent-react-v1 only: send a GBNF grammar of the reply layout (one thought line, one of "
                             "the query's functions, a JSON object) as the request's `grammar`, which llama.cpp's "
                             "servers enforce, so a model that does not keep the layout still acts.")
    parser.add_argument("--api-key", default="EMPTY", help="API key of the agent engine (default EMPTY).")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="Queries in flight (default: 16 on vLLM, 2 on other engines such as transformers serve).")
    parser.add_argument("--temperature", type=float, default=0.0, help="Agent temperature (default 0).")
    parser.add_argument("--max-tokens", type=int, default=1024, help="Tokens per agent step (default 1024).")
    parser.add_argument("--single-chain-max-step", type=int, default=12,
                        help="Depth budget of a chain / tree path (StableToolBench: 12).")
    parser.add_argument("--max-query-count", type=int, default=200,
                        help="Model calls per query for DFS (StableToolBench: 200).")
    parser.add_argument("--max-observation-length", type=int, default=1024,
                        help="Observations are cut to this many characters plus '...' (default 1024).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds per agent call, retries included.")
    parser.add_argument("--server-timeout", type=float, default=120.0, help="Seconds per /virtual call.")
    parser.add_argument("--system-prompt-file", default=None,
                        help="Use this text as the agent's system prompt ({tools} is replaced by the tool list).")
    parser.add_argument("--tool-choice", default=None, help="Sent as the request's tool_choice when given.")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N queries of each group.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")


def agent_settings_from(args: argparse.Namespace, base_urls: list[str] | None = None, model: str | None = None,
                        method: str | None = None) -> AgentSettings:
    """AgentSettings from parsed arguments; ValueError for values that cannot work."""
    method = method or args.method
    check_method(method)
    for name in ("concurrency", "max_tokens", "single_chain_max_step", "max_query_count", "max_observation_length"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    return AgentSettings(server=args.server, base_urls=base_urls or args.base_url, model=model or args.model,
                         method=method, api_key=args.api_key, temperature=args.temperature,
                         max_tokens=args.max_tokens, single_chain_max_step=args.single_chain_max_step,
                         max_query_count=args.max_query_count, max_observation_length=args.max_observation_length,
                         concurrency=args.concurrency, timeout=args.timeout, server_timeout=args.server_timeout,
                         system_prompt_file=args.system_prompt_file, tool_choice=args.tool_choice,
                         prompt_format=args.prompt_format, react_grammar=args.react_grammar)


def add_judge_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> argparse.ArgumentParser:
    """The one set of judge-engine flags (the fields of JudgeSettings), for every command that asks a judge:
    eval/fac.py, eval/judge_agreement.py, eval/sowr.py and `mirrorapi benchmark` (`prefix` "judge-" there,
    where the agent has flags of its own)."""
    parser.add_argument(f"--{prefix}base-url", required=True, nargs="+", metavar="URL",
                        help="OpenAI-compatible base URL(s) of the judge engine, e.g. http://127.0.0.1:12345/v1.")
    parser.add_argument(f"--{prefix}model", required=True, help="The judge's model name on that engine.")
    parser.add_argument(f"--{prefix}api-key", default="EMPTY", help="API key of the judge engine (default EMPTY).")
    parser.add_argument(f"--{prefix}concurrency", type=int, default=None,
                        help="Judge requests in flight (default: 16 on vLLM, 2 on `transformers serve` and other "
                             "engines, which work on one request at a time).")
    parser.add_argument(f"--{prefix}max-tokens", type=int, default=256, help="Tokens per judge output (default 256).")
    parser.add_argument(f"--{prefix}temperature", type=float, default=0.0, help="Judge temperature (default 0).")
    parser.add_argument(f"--{prefix}timeout", type=float, default=120.0,
                        help="Seconds per judge call, retries included (default 120).")
    return parser


def judge_settings_from(args: argparse.Namespace, prefix: str = "") -> JudgeSettings:
    """JudgeSettings from the flags of `add_judge_arguments`; ValueError (one line) for values that cannot work."""
    value = lambda name: getattr(args, prefix.replace("-", "_") + name)  # noqa: E731
    if (value("concurrency") is not None and value("concurrency") < 1) or value("max_tokens") < 1:
        raise ValueError(f"--{prefix}concurrency and --{prefix}max-tokens must be at least 1")
    if value("timeout") <= 0:
        raise ValueError(f"--{prefix}timeout must be positive")
    return JudgeSettings(base_urls=value("base_url"), model=value("model"), api_key=value("api_key"),
                         concurrency=value("concurrency"), max_tokens=value("max_tokens"),
                         temperature=value("temperature"), timeout=value("timeout"))


def sowr_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description.splitlines()[0], epilog=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--reference", required=True, help="The reference model's converted answers (one model).")
    parser.add_argument("--candidate", required=True, nargs="+", help="Candidate answers (files or folders).")
    parser.add_argument("--ids", required=True, help="A test_query_ids (or test_instruction) file, or a folder.")
    add_judge_arguments(parser)
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--rounds", type=int, default=3, help="Evaluations per query; majority wins (default 3).")
    parser.add_argument("--overwrite", action="store_true", help="Drop earlier SoPR verdicts and preferences in --out.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser
