"""A small benchmark with RECORDED agents (replays, not models), for the demo and a quick self-check.

`recorded_benchmark` runs the whole `mirrorapi benchmark` path on StableToolBench's example queries:
- the agents are two recorded-agent engines replaying StableToolBench's own ChatGPT runs (`CoT@1` from
  its CoT answers, `DFS_woFilter_w2` from its DFS trees);
- the tools are a virtual server in replay mode, in this process, whose cache holds the observations
  of those runs (so a replayed call gets the answer it got then);
- the judge is any engine (the demo's tiny judge).
The report then has a row per method, StableToolBench-style tables, counts and a plot.

Real agents can run beside the replays (`agents`, e.g. SmolLM2-135M-Instruct in the `agent-react-v1`
text protocol). Their calls rarely match a recorded one, so with `simulator` (an engine's base URL and
model) the server simulates what its cache lacks; the replays still get their recorded answers (hits).

    python -m harness.recorded_benchmark --judge-base-url URL --judge-model NAME --out DIR \
        [--agent LABEL MODEL BASE_URL --agent-format LABEL agent-react-v1] \
        [--simulator-base-url URL --simulator-model NAME] [--limit N] [--single-chain-max-step 12]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from harness import REPO
from harness.processes import free_port, serve_in_thread
from harness.recorded_agent import load_recordings, recorded_cache_folder, serve_recorded_agent
from mirrorapi.command_line import add_settings_arguments, settings_fields, settings_from_args
from mirrorapi.evaluation.agent.settings import AgentSettings
from mirrorapi.evaluation.benchmark import AgentSpec, BenchmarkResult, parse_agents, run_benchmark
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.serving.app import create_app
from mirrorapi.serving.config import ServerSettings

RECORDINGS = {"CoT@1": "virtual_chatgpt_cot", "DFS_woFilter_w2": "virtual_chatgpt_dfs"}


@contextlib.contextmanager
def replay_server(
    tools: list[Path], cache_folder: Path, workdir: Path, simulator: tuple[str, str] | None = None, few_shot: int = 2
) -> Iterator[str]:
    """A virtual server on a free loopback port whose cache holds `cache_folder`; yields the /virtual URL.
    Replay mode (a miss is an error observation), or with `simulator` = (base URL, model) simulate mode:
    a miss is simulated with `few_shot` recorded answers of the same API as examples, without structured
    output (llama.cpp's server does not take OpenAI's json_schema response format)."""
    port = free_port()
    engine = (
        {
            "api_base": simulator[0],
            "model": simulator[1],
            "mode": "simulate",
            "few_shot": few_shot,
            "structured_output": False,
            "max_tokens": 256,
        }
        if simulator
        else {"api_base": "http://127.0.0.1:9/v1", "model": "none", "mode": "replay"}
    )
    settings = ServerSettings(
        **engine,
        tools_folder=tools,
        cache_folder=cache_folder,
        cache_path=workdir / "replay-cache.sqlite",
        log_file=workdir / "replay-requests.log",
        log_level="warning",
        port=port,
    )
    with serve_in_thread(create_app(settings), port, timeout=60, access_log=False) as url:
        yield url + "/virtual"


def recorded_benchmark(
    stabletoolbench: str | os.PathLike,
    tools: str | os.PathLike,
    judge: JudgeSettings,
    out: str | os.PathLike,
    repeats: int = 1,
    progress: bool = False,
    limit: int | None = None,
    agents: Sequence[AgentSpec] = (),
    simulator: tuple[str, str] | None = None,
    template: AgentSettings | None = None,
) -> BenchmarkResult:
    """Recorded CoT and DFS runs on the example queries, scored by `judge`; the report is `<out>/report.md`.

    `stabletoolbench`: a folder with `solvable_queries_example/` and `data_example/answer/` (StableToolBench's
    layout; `data/samples/stabletoolbench` has both). `tools`: a tools folder (`data/samples/tools`).
    `limit`: only the first N queries of each group (the demo's budget; 588 is the first of the examples).
    `agents`: real agents run with CoT@1 beside the replays (their `prompt_format` if set); `simulator`: see
    `replay_server`; `template`: the agents' other settings (depth, tokens, timeouts)."""
    stb, out = Path(stabletoolbench), Path(out)
    queries = stb / "solvable_queries_example" / "test_instruction"
    query_files = sorted(queries.glob("*.json"))
    all_queries = [q for file in query_files for q in json.loads(file.read_text(encoding="utf-8"))]
    workdir = out / "replay"
    for folder in RECORDINGS.values():
        recorded_cache_folder(
            load_recordings([stb / "data_example" / "answer" / folder]), all_queries, workdir / "cache"
        )
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(replay_server([Path(tools), *query_files], workdir / "cache", workdir, simulator))
        replays = []
        for method, folder in RECORDINGS.items():
            base_url, _ = stack.enter_context(
                serve_recorded_agent([stb / "data_example" / "answer" / folder], free_port())
            )
            replays.append(AgentSpec("chatgpt_replay", "recorded-agent", [base_url], methods=[method]))
        real = [replace(agent, methods=agent.methods or ["CoT@1"]) for agent in agents]
        template = replace(
            template or AgentSettings(server="", base_urls=[], model="recorded-agent", concurrency=4), server=server
        )
        return run_benchmark(
            queries,
            replays + real,
            list(RECORDINGS),
            template,
            judge,
            out,
            tools=[tools],
            repeats=repeats,
            progress=progress,
            limit=limit,
        )


# The agent settings this harness takes as flags (AgentSettings' own); the others are the replays' own.
RUN_SETTINGS = ("max_tokens", "react_grammar", "single_chain_max_step", "timeout")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.recorded_benchmark", allow_abbrev=False, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stabletoolbench", default=str(REPO / "data" / "samples" / "stabletoolbench"))
    parser.add_argument("--tools", default=str(REPO / "data" / "samples" / "tools"))
    parser.add_argument("--out", required=True, help="Output folder (reruns resume in it).")
    parser.add_argument(
        "--agent",
        nargs="+",
        action="append",
        default=[],
        metavar="LABEL MODEL BASE_URL",
        help="A real agent beside the replays, run with CoT@1. Repeat for more.",
    )
    parser.add_argument(
        "--agent-format",
        nargs=2,
        action="append",
        default=[],
        metavar=("LABEL", "FORMAT"),
        help="The prompt format of one --agent, e.g. agent-react-v1 (default agent-v1).",
    )
    parser.add_argument("--simulator-base-url", default=None, help="Simulate cache misses with this engine.")
    parser.add_argument("--simulator-model", default=None, help="The simulator's model name on that engine.")
    add_settings_arguments(
        parser, AgentSettings, exclude=[name for name in settings_fields(AgentSettings) if name not in RUN_SETTINGS]
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="Queries in flight per agent (default 4: the "
        "replayed agents answer at once, unlike the engines AgentSettings' default is made for).",
    )
    parser.add_argument("--limit", type=int, default=None, help="Only the first N queries.")
    parser.add_argument("--repeats", type=int, default=1, help="SoPR / SoWR rounds (default 1).")
    add_settings_arguments(parser, JudgeSettings, prefix="judge-")
    args = parser.parse_args(argv)
    if (args.simulator_base_url is None) != (args.simulator_model is None):
        parser.error("--simulator-base-url and --simulator-model go together")
    try:
        agents = parse_agents(args.agent, args.agent_format)
        template = settings_from_args(
            args, AgentSettings, server="", base_urls=[], model="", concurrency=args.concurrency
        )
        judge = settings_from_args(args, JudgeSettings, prefix="judge-")
        simulator = (args.simulator_base_url, args.simulator_model) if args.simulator_base_url else None
        result = recorded_benchmark(
            args.stabletoolbench,
            args.tools,
            judge,
            args.out,
            repeats=args.repeats,
            progress=True,
            limit=args.limit,
            agents=agents,
            simulator=simulator,
            template=template,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.report.read_text(encoding="utf-8"))
    return 0 if result.complete else 1


if __name__ == "__main__":
    sys.exit(main())
