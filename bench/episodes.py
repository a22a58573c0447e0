"""OpenEnv episodes at scale (issue 34 §2): 1,024 / 4,096 / 16,384 episodes open at once on one server, each
stepping; steps/s, latency percentiles, what answered them, and the server's resident memory per open episode.
Prints one JSON object.

    .venv/bin/python bench/episodes.py [--episodes 1024 4096 16384] [--seconds 20] [--variants hits stub]
                                       [--workers 1] [--store sqlite|postgresql]

Each variant is a real server process (`serving/main_mirrorapi.py`, log level warning) on the bundled sample
tools with the sample's real pairs imported into its cache. Each episode is a WebSocket on `/ws` (OpenEnv's
session endpoint, the messages of OpenEnv's client; this process drives them with the `websockets` client,
cheaper per step than openenv-core's, on uvloop), reset on the toolset `tool=APIBank/apibank_account`:
- `hits`: every step calls one of the toolset's 34 recorded calls (a cache hit whatever the session history:
  recorded answers serve every session), so the server's whole per-step path runs and no engine;
- `stub`: every step is a new call, simulated by a stub engine process answering each after 50 ms.
The episodes are opened first (256 handshakes at a time), each steps once, and the server's VmRSS then, less
its VmRSS after a warm-up, over the episodes is the memory per open episode. Then every episode steps as fast
as its answers come back (a closed loop: no think time) for `--seconds`; each step's latency is the time from
its send to its answer. Both processes (server and clients) share this machine's cores, so the figures are
what one machine does with its load generator on it. Open files: both raise their soft limit to the hard one
(the server at start; 16,384 episodes are 16,384 sockets on each side).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "data" / "samples" / "tools"
PAIRS = REPO / "data" / "samples" / "pairs.jsonl"
TOOLSET = "tool=APIBank/apibank_account"
HANDSHAKES = 256  # WebSocket handshakes at once while the episodes open
STUB_DELAY = 0.05


def memory_mb(pids: list[int]) -> float:
    """VmRSS of the server's processes, summed."""
    total = 0
    for pid in pids:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        total += int(fields["VmRSS"].split()[0])
    return total / 1024


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the server's processes so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def serving_processes(pid: int, workers: int) -> list[int]:
    """The processes that serve: the server itself, or with --workers its worker processes."""
    if workers == 1:
        return [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(c)
        for c in children
        if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()
        and b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()
    ]


def recorded_calls() -> list[tuple[str, dict]]:
    """(function name in TOOLSET, arguments) of every distinct recorded call of the toolset in the sample pairs."""
    from mirrorapi.names import api_key_name, standardize
    from mirrorapi.tools import ToolRegistry, UnknownName
    from mirrorapi.toolsets import select_toolset

    registry = ToolRegistry.load([TOOLS])
    names = {(d.category, d.tool, d.api): name for name, d in select_toolset(registry, TOOLSET).functions.items()}
    calls, seen = [], set()
    for line in PAIRS.read_text(encoding="utf-8").splitlines():
        pair = json.loads(line)
        try:
            doc = registry.resolve(pair["category"], standardize(pair["tool_name"]), api_key_name(pair["api_name"]))
        except UnknownName:
            continue
        arguments = pair["tool_input"] if isinstance(pair["tool_input"], dict) else json.loads(pair["tool_input"])
        key = ((doc.category, doc.tool, doc.api), json.dumps(arguments, sort_keys=True))
        if key[0] in names and key not in seen:
            seen.add(key)
            calls.append((names[key[0]], arguments))
    return calls


class Stats:
    def __init__(self):
        self.latencies: list[float] = []
        self.outcomes: dict[str, int] = {}
        self.failed = 0  # steps with no observation (an error message, a closed connection)


async def run_episodes(
    url: str, count: int, seconds: float, calls: list[tuple[str, dict]], stub: bool, server: list[int]
) -> dict:
    from websockets.asyncio.client import connect

    stats, opened = Stats(), []
    start_stepping, stop_at = asyncio.Event(), [0.0]
    handshakes = asyncio.Semaphore(HANDSHAKES)
    all_open = asyncio.Event()

    run = time.time_ns()  # in the stub's calls: an episode of an earlier run (the same calls) would be a replay, hits

    def step_message(episode: int, step: int) -> str:
        if stub:  # a new call each time: simulated
            name, arguments = "getusertoken", {"username": f"user {run}-{episode}", "password": f"step {step}"}
        else:
            name, arguments = calls[(episode + step) % len(calls)]
        return json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}})

    async def episode(index: int) -> None:
        async with handshakes:
            ws = await connect(
                url.replace("http://", "ws://") + "/ws",
                compression=None,
                max_size=None,
                ping_interval=None,
                open_timeout=300,
                close_timeout=30,
            )
        try:
            await ws.send(json.dumps({"type": "reset", "data": {"toolset": TOOLSET}}))
            assert json.loads(await ws.recv())["type"] == "observation"
            await ws.send(step_message(index, 0))
            assert json.loads(await ws.recv())["type"] == "observation"
            opened.append(index)
            if len(opened) == count:
                all_open.set()
            await start_stepping.wait()
            step = 1
            while True:
                message = step_message(index, step)
                sent = time.perf_counter()
                if sent >= stop_at[0]:
                    return
                await ws.send(message)
                reply = json.loads(await ws.recv())
                answered = time.perf_counter()
                step += 1
                if answered > stop_at[0]:
                    return
                if reply.get("type") != "observation":
                    stats.failed += 1
                    continue
                outcome = reply["data"]["observation"]["metadata"].get("outcome", "none")
                stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
                stats.latencies.append(answered - sent)
        finally:
            await ws.close()

    began = time.perf_counter()
    tasks = [asyncio.create_task(episode(i)) for i in range(count)]
    waiting = asyncio.create_task(all_open.wait())
    done, _ = await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:  # an episode failed to open
        for task in done:
            task.result()
    open_seconds = time.perf_counter() - began
    rss_open = memory_mb(server)
    cpu_before = cpu_seconds(server)
    stop_at[0] = time.perf_counter() + seconds
    start_stepping.set()
    await asyncio.sleep(seconds)  # the window: steps answered in it are counted, and the server's CPU in it
    server_cpu = cpu_seconds(server) - cpu_before
    await asyncio.gather(*tasks)
    latencies = sorted(stats.latencies)
    steps = len(latencies)

    def percentile(q: float) -> float | None:
        return round(latencies[min(steps - 1, int(q * steps))] * 1000, 1) if steps else None

    return {
        "episodes": count,
        "open_seconds": round(open_seconds, 1),
        "rss_mb_open": round(rss_open, 1),
        "steps": steps,
        "failed_steps": stats.failed,
        "outcomes": stats.outcomes,
        "answered_share": round(steps / (steps + stats.failed), 4) if steps + stats.failed else None,
        "steps_per_second": round(steps / seconds, 1),
        "latency_ms": {
            "p50": percentile(0.50),
            "p90": percentile(0.90),
            "p99": percentile(0.99),
            "max": percentile(1.0),
        },
        "server_cpu_ms_per_step": round(server_cpu * 1000 / steps, 3) if steps else None,
    }


def run_variant(name: str, args, store: list[str], work: Path, calls: list) -> dict:
    from harness.fake_engines import stub_engine_process
    from harness.processes import checkout_env, free_port, stop, wait_until_ready

    stub = name == "stub"
    engine_port = free_port()
    engine = stub_engine_process(engine_port, STUB_DELAY) if stub else None
    port = free_port()
    log = work / f"{name}.log"
    command = [
        sys.executable,
        "serving/main_mirrorapi.py",
        "--tools-folder",
        str(TOOLS),
        *store,
        "--port",
        str(port),
        "--api-base",
        f"http://127.0.0.1:{engine_port}/v1",
        "--model",
        "stub",
        "--log-level",
        "warning",
        "--max-episodes",
        str(max(args.episodes) + 64),
        "--engine-max-in-flight",
        "4096",
        "--engine-max-waiting",
        "65536",
        "--engine-timeout",
        "300",
        "--workers",
        str(args.workers),
    ]
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(
            command, cwd=REPO, env=checkout_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    results = []
    try:
        wait_until_ready(url + "/live", 300, process=server, log_path=log)
        from harness.processes import poll_until

        pid = poll_until(
            lambda: (
                (found := serving_processes(server.pid, args.workers)) and len(found) == args.workers and found or None
            ),
            120,
            "the server's workers",
        )
        asyncio.run(run_episodes(url, 16, 2.0, calls, stub, pid))  # warm-up: imports, caches, the first pages
        for count in args.episodes:
            rss_before = memory_mb(pid)
            result = asyncio.run(run_episodes(url, count, args.seconds, calls, stub, pid))
            result["rss_mb_before"] = round(rss_before, 1)
            result["rss_kb_per_open_episode"] = round((result["rss_mb_open"] - rss_before) * 1024 / count, 1)
            results.append(result)
            print(json.dumps({name: result}), file=sys.stderr, flush=True)
    finally:
        stop(server, grace=30)
        if engine is not None:
            stop(engine)
    return {"scales": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--episodes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--seconds", type=float, default=20.0, help="How long every episode steps, per scale.")
    parser.add_argument("--variants", nargs="+", choices=["hits", "stub"], default=["hits", "stub"])
    parser.add_argument("--workers", type=int, default=1, help="Server processes (the server's --workers).")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import uvloop

    from harness.postgres_server import temporary_postgres
    from mirrorapi.serving.app import raise_open_file_limit

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    limits = raise_open_file_limit()
    calls = recorded_calls()
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "open_files_limit": {
            "soft_before": limits[0],
            "soft": limits[1],
            "hard": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        },
        "toolset": TOOLSET,
        "recorded_calls": len(calls),
        "stub_delay_s": STUB_DELAY,
        "workers": args.workers,
        "store": args.store,
        "seconds_per_scale": args.seconds,
        "variants": {},
    }
    work = Path(tempfile.mkdtemp(prefix="mirrorapi-episodes-bench-"))
    try:
        for name in args.variants:
            with temporary_postgres() if args.store == "postgresql" else _no_database() as database:
                store = ["--cache-url", database.url] if database else ["--cache-path", str(work / f"{name}.sqlite")]
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "mirrorapi.cli",
                        "cache",
                        "import",
                        str(PAIRS),
                        "--cache",
                        store[1],
                        "--tools",
                        str(TOOLS),
                    ],
                    cwd=REPO,
                    check=True,
                    capture_output=True,
                )
                result["variants"][name] = run_variant(name, args, store, work, calls)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


class _no_database:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        pass


if __name__ == "__main__":
    main()
