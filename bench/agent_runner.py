"""Agent runner benchmark: the runner's own CPU per agent step, and queries in flight; prints one JSON object.

    python bench/agent_runner.py [--queries 256] [--concurrency 128]

Set-up (three processes besides this one's runner):
- the agent engine: the RECORDED agent (replaying StableToolBench's CoT runs of its 3 example
  queries) answering every chat completion after 50 ms;
- the tools: the real virtual server (`serving/main_mirrorapi.py`, `is_save: false`, so every call
  is a cache miss) in front of a stub simulator engine answering after 50 ms (harness/fake_engines.py);
- the queries: `--queries` copies of the 3 example queries (distinct ids; the recording matches
  them by their text).
`runner_cpu_ms_per_step` = this process's CPU time (user + system) over the run / agent steps
(model calls); it holds the runner only. `peak_queries_in_flight` = the most chat completions the
agent engine held at once (each query has at most one). Targets: <= 2 ms, >= 64.
"""

import argparse
import asyncio
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from server_load import load_average  # noqa: E402

from harness.fake_engines import stub_engine_process  # noqa: E402
from harness.processes import checkout_env, free_port, stop, wait_until_ready  # noqa: E402
from mirrorapi.evaluation.agent.run import run_agent_async  # noqa: E402
from mirrorapi.evaluation.agent.settings import AgentSettings
from mirrorapi.versions import package_versions  # noqa: E402

SAMPLES = REPO / "data" / "samples"
STB = SAMPLES / "stabletoolbench"
LATENCY = 0.05
TARGETS = {"runner_cpu_ms_per_step": 2.0, "peak_queries_in_flight": 64}


def _agent_engine(port: int) -> None:
    import uvicorn

    from harness.recorded_agent import RecordedAgent, load_recordings

    agent = RecordedAgent(load_recordings([STB / "data_example" / "answer" / "virtual_chatgpt_cot"]), latency=LATENCY)
    uvicorn.run(agent.app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    base = json.loads((STB / "solvable_queries_example" / "test_instruction" / "G1_instruction.json").read_text())
    queries = [
        {**base[i % len(base)], "query_id": 100000 + i, "query": base[i % len(base)]["query"] + f" (copy {i})"}
        for i in range(args.queries)
    ]
    (work / "G1_instruction.json").write_text(json.dumps(queries))
    ctx = multiprocessing.get_context("spawn")
    agent_port, sim_port, server_port = free_port(), free_port(), free_port()
    agent = ctx.Process(target=_agent_engine, args=(agent_port,), daemon=True)
    simulator = stub_engine_process(sim_port, LATENCY)
    agent.start()
    config = work / "server.yml"
    config.write_text(
        f"api_base: http://127.0.0.1:{sim_port}/v1\nmodel: stub\nport: {server_port}\n"
        f"tools_folder: [{SAMPLES / 'tools'}, {work / 'G1_instruction.json'}]\nis_save: false\n"
        f"cache_path: {work / 'cache.sqlite'}\nlog_file: {work / 'requests.log'}\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(REPO / "serving" / "main_mirrorapi.py"), "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=checkout_env(),
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{agent_port}/stats", 60)
        wait_until_ready(f"http://127.0.0.1:{server_port}/health", 60, process=server)
        settings = AgentSettings(
            server=f"http://127.0.0.1:{server_port}/virtual",
            base_urls=[f"http://127.0.0.1:{agent_port}/v1"],
            model="recorded-agent",
            concurrency=args.concurrency,
        )
        load_before = load_average()
        cpu, wall = time.process_time(), time.monotonic()
        run = asyncio.run(run_agent_async(work / "G1_instruction.json", settings, work / "out", progress=False))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        stats = httpx.get(f"http://127.0.0.1:{agent_port}/stats").json()
    finally:
        stop(server)
        agent.terminate()
        simulator.terminate()
        simulator.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    steps = stats["requests"]
    result = {
        "queries": args.queries,
        "concurrency": args.concurrency,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "answered": run.done,
        "failed": len(run.failures),
        "agent_steps": steps,
        "wall_s": round(wall, 2),
        "steps_per_s": round(steps / wall, 1),
        "runner_cpu_ms_per_step": round(1000 * cpu / steps, 3),
        "peak_queries_in_flight": stats["peak_in_flight"],
        "engine_latency_ms": 1000 * LATENCY,
        "simulator_latency_ms": 1000 * LATENCY,
        "targets": TARGETS,
    }
    result["meets_targets"] = (
        result["runner_cpu_ms_per_step"] <= TARGETS["runner_cpu_ms_per_step"]
        and result["peak_queries_in_flight"] >= TARGETS["peak_queries_in_flight"]
    )
    result["versions"] = package_versions()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
