"""A small benchmark with RECORDED agents (replays, not models), for the demo and a quick self-check.

`recorded_benchmark` runs the whole `mirrorapi benchmark` path on StableToolBench's example queries:
- the agents are two recorded-agent engines replaying StableToolBench's own ChatGPT runs (`CoT@1` from
  its CoT answers, `DFS_woFilter_w2` from its DFS trees);
- the tools are a virtual server in replay mode, in this process, whose cache holds the observations
  of those runs (so a replayed call gets the answer it got then);
- the judge is any engine (the demo's tiny judge).
The report then has a row per method, StableToolBench-style tables, counts and a plot.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from mirrorapi.evaluation.agent import AgentSettings
from mirrorapi.evaluation.benchmark import AgentSpec, BenchmarkResult, run_benchmark
from mirrorapi.evaluation.judging import JudgeSettings
from mirrorapi.evaluation.recorded_agent import load_recordings, recorded_cache_folder, serve_recorded_agent
from mirrorapi.processes import free_port, serve_in_thread
from mirrorapi.serving.app import create_app
from mirrorapi.serving.config import ServerSettings

RECORDINGS = {"CoT@1": "virtual_chatgpt_cot", "DFS_woFilter_w2": "virtual_chatgpt_dfs"}


@contextlib.contextmanager
def replay_server(tools: list[Path], cache_folder: Path, workdir: Path) -> Iterator[str]:
    """A virtual server in replay mode (no simulator engine) on a free loopback port; yields the /virtual URL."""
    port = free_port()
    settings = ServerSettings(api_base="http://127.0.0.1:9/v1", model="none", mode="replay", tools_folder=tools,
                              cache_folder=cache_folder, cache_path=workdir / "replay-cache.sqlite",
                              log_file=workdir / "replay-requests.log", log_level="warning", port=port)
    with serve_in_thread(create_app(settings), port, timeout=60, access_log=False) as url:
        yield url + "/virtual"


def recorded_benchmark(stabletoolbench: str | os.PathLike, tools: str | os.PathLike, judge: JudgeSettings,
                       out: str | os.PathLike, repeats: int = 1, progress: bool = False,
                       limit: int | None = None) -> BenchmarkResult:
    """Recorded CoT and DFS runs on the example queries, scored by `judge`; the report is `<out>/report.md`.

    `stabletoolbench`: a folder with `solvable_queries_example/` and `data_example/answer/` (StableToolBench's
    layout; `data/samples/stabletoolbench` has both). `tools`: a tools folder (`data/samples/tools`).
    `limit`: only the first N queries of each group (the demo's budget; 588 is the first of the examples)."""
    stb, out = Path(stabletoolbench), Path(out)
    queries = stb / "solvable_queries_example" / "test_instruction"
    query_files = sorted(queries.glob("*.json"))
    all_queries = [q for file in query_files for q in json.loads(file.read_text(encoding="utf-8"))]
    workdir = out / "replay"
    for folder in RECORDINGS.values():
        recorded_cache_folder(load_recordings([stb / "data_example" / "answer" / folder]), all_queries,
                              workdir / "cache")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(replay_server([Path(tools), *query_files], workdir / "cache", workdir))
        agents = []
        for method, folder in RECORDINGS.items():
            base_url, _ = stack.enter_context(
                serve_recorded_agent([stb / "data_example" / "answer" / folder], free_port()))
            agents.append(AgentSpec("chatgpt_replay", "recorded-agent", [base_url], methods=[method]))
        template = AgentSettings(server=server, base_urls=[], model="recorded-agent", concurrency=4)
        return run_benchmark(queries, agents, list(RECORDINGS), template, judge, out, tools=[tools],
                             repeats=repeats, progress=progress, limit=limit)
