"""Throughput of `--workers N` (issue 21 §3): hits and misses at N = 1, 2, side by side in one run; prints one JSON.

    python bench/workers.py [--workers 1 2] [--runs 2] [--tools ../shared/data/toolenv/toolenv2404]

bench/server.py's workload and instruments (its load generator and stub engine, each a process of its own):
a cache of 20,000 entries over 2,000 APIs of the tools folder, 64 closed-loop clients; per N and run, a fresh
server (`serving/main_mirrorapi.py --workers N`) on a fresh copy of the cache: hits (every call cached) and
misses (every call new, the stub engine answering after 50 ms). Server CPU is that of the whole process tree
(uvicorn's parent and its workers). The runs alternate the values of N, so that the machine's drift falls on
each alike; medians over `--runs`. `scaling` is each figure at N over the same at the first N. On this 2-core
machine the load generator and the stub engine share the cores with the workers: the scaling is bounded
by the machine, not only by the server.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the library and the harnesses of this clone

# bench/server.py's instruments, servers and workloads (siblings of this script)
import server_load  # noqa: E402
import server_workloads  # noqa: E402


def bench_workers(
    args, work: Path, n: int, run_index: int, bodies: list[dict], hit_bodies: Path, engine_port: int
) -> dict:
    from harness.processes import free_port

    shutil.copy(work / "base.sqlite", work / "cache.sqlite")
    port = free_port()
    command = server_workloads.mirrorapi_command(
        args,
        port,
        engine_port,
        work / "cache.sqlite",
        None,
        work / f"workers{n}-requests.jsonl",
        extra=["--workers", str(n)],
    )
    misses = work / "misses.json"
    misses.write_text(
        json.dumps(
            [
                json.dumps(
                    {
                        **b,
                        "tool_input": json.dumps(
                            {"run": run_index, "workers": n, "miss": i, **json.loads(b["tool_input"])}
                        ),
                    }
                )
                for i, b in enumerate(bodies[: args.misses])
            ]
        )
    )
    with server_workloads.started(command, work, f"workers{n}", f"http://127.0.0.1:{port}/live") as (process, startup):
        server_load.run_load(port, process.pid, hit_bodies, 16, 4000)  # warm-up: every worker up and warm
        return {
            "startup_s": startup,
            "hits_64": server_load.run_load(port, process.pid, hit_bodies, server_workloads.CLIENTS, args.requests),
            "misses_64": server_load.run_load(port, process.pid, misses, server_workloads.CLIENTS, args.misses),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="The values of N.")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16000, help="Hit requests per server.")
    parser.add_argument("--misses", type=int, default=6400, help="Miss requests per server.")
    args = parser.parse_args()
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/workers.py: tools folder not found: {args.tools}")
    sys.path.insert(0, str(REPO))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops the servers and the engine
    from harness.fake_engines import stub_engine_process
    from harness.processes import free_port
    from mirrorapi.versions import package_versions

    work = Path(tempfile.mkdtemp(prefix="mirrorapi-bench-workers-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, server_workloads.ENGINE_LATENCY)
    load_before = server_load.load_average()
    runs: dict[int, list[dict]] = {n: [] for n in args.workers}
    try:
        bodies = server_workloads.build_cache(args.tools, work / "base.sqlite")
        hit_bodies = work / "hits.json"
        hit_bodies.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        for run_index in range(args.runs):
            for n in args.workers:
                runs[n].append(bench_workers(args, work, n, run_index, bodies, hit_bodies, engine_port))
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    servers = {f"workers_{n}": server_load.median_of(runs[n]) for n in args.workers}
    # Each run's ratio to the first worker count's same run, then their median (not a ratio of two medians).
    base = args.workers[0]
    scaling = {
        f"workers_{n}": server_load.median_of(
            [
                {
                    f"{load}_{key}": round(run[load][key] / base_run[load][key], 3)
                    for load in ("hits_64", "misses_64")
                    for key in ("rps", "server_cpu_ms_per_request")
                }
                for run, base_run in zip(runs[n], runs[base], strict=True)
            ]
        )
        for n in args.workers
    }
    print(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "load_average_before": load_before,
                "load_average_after": server_load.load_average(),
                "cpu_count": os.cpu_count(),
                "clients": server_workloads.CLIENTS,
                "engine_latency_s": server_workloads.ENGINE_LATENCY,
                "runs": args.runs,
                "servers": servers,
                "scaling": scaling,
                "per_run": {f"workers_{n}": runs[n] for n in args.workers},
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
