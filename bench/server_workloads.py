"""What bench/server.py runs: the cache of the run, and each server under test started fresh with its workloads
(the load generator of bench/server_load.py against it, 64 clients unless said otherwise).

- engine_direct: the load generator straight at the stub engine (no server);
- bare and the floors (bench/server_floors.py);
- mirrorapi (`serving/main_mirrorapi.py`, one request log line per request to a file as in production):
  start-up, hits with 1 and 64 clients and 64 paced to 1,000 requests/s, misses (every call new);
- mirrorapi_route: the same server with /virtual as a FastAPI route (bench/virtual_route.py), hits;
- stabletoolbench: its `server/main.py` on uvicorn bound to 127.0.0.1, config.yml in a work folder.
"""

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from server_floors import ENGINE_REQUEST
from server_load import run_load

from harness.processes import checkout_env, free_port, stop, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
FLOORS = Path(__file__).with_name("server_floors.py")
ENGINE_LATENCY = 0.05
CLIENTS = 64


def build_cache(tools: str, path: Path, n_apis: int = 2000, per_api: int = 10) -> list[dict]:
    """20,000 entries over 2,000 APIs spread over the folder; returns the agent bodies of the hits."""
    from mirrorapi.serving.cache import ResponseCache
    from mirrorapi.tools import ToolRegistry

    docs = sorted(ToolRegistry.load([tools]), key=lambda d: (d.category, d.tool, d.api))
    docs = docs[:: max(1, len(docs) // n_apis)][:n_apis]
    rows, bodies = [], []
    rng = random.Random(20251121)
    for doc in docs:
        required, optional = doc.parameter_names()
        names = required or optional[:1] or ["q"]
        for i in range(per_api):
            arguments = {name: f"value {i} {rng.random():.6f}" for name in names}
            text = " ".join(f"word{rng.randrange(10000)}" for _ in range(rng.randrange(20, 160)))  # ~0.2-1.6 kB
            rows.append((doc.category, doc.tool, doc.api, arguments, "", text))
            bodies.append(
                {
                    "category": doc.category,
                    "tool_name": doc.tool,
                    "api_name": doc.api,
                    "tool_input": json.dumps(arguments, indent=2),
                    "strip": "truncate",
                    "toolbench_key": "",
                }
            )
    cache = ResponseCache(path)
    cache.put_many(rows, "imported:bench")
    cache.close()
    return bodies


def export_for_stabletoolbench(cache_path: Path, folder: Path) -> None:
    from mirrorapi.serving.cache import ResponseCache, export_stabletoolbench_cache

    cache = ResponseCache(cache_path)
    try:
        export_stabletoolbench_cache(cache, folder, identity="")
    finally:
        cache.close()


def count_entries(location: Path | str) -> int:
    from mirrorapi.serving.cache import open_cache

    cache = open_cache(location)
    try:
        return cache.count()
    finally:
        cache.close()


# ------------------------------------------------------------------------------- servers
@contextlib.contextmanager
def started(
    command: list[str], work: Path, name: str, ready_url: str, cwd: Path | None = None, env: dict | None = None
):
    """A server process, ready when the block starts (yields (process, seconds until ready)); stopped after.
    `env`: by default this process's with this clone first on PYTHONPATH (`checkout_env`)."""
    log_path = work / f"{name}.log"
    with open(log_path, "w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=checkout_env() if env is None else env,
            start_new_session=True,
        )
        try:
            wait_until_ready(ready_url, 180, process=process, log_path=log_path, interval=0.02)
            yield process, time.perf_counter() - start
        finally:
            stop(process, grace=30)


def bench_engine_direct(work: Path, engine_port: int, engine_pid: int, requests: int) -> dict:
    """The instrument's own ceiling: the load generator's 64 clients straight at the stub engine, with a
    chat request of the size the server sends (a prompt of about 3 kB), no server in between."""
    bodies = work / "engine-direct.json"
    bodies.write_text(json.dumps([ENGINE_REQUEST.decode()]))
    return {"calls_64": run_load(engine_port, engine_pid, bodies, CLIENTS, requests, path="/v1/chat/completions")}


def bench_bare(work: Path, hit_bodies: Path, requests: int) -> dict:
    port = free_port()
    with started(
        [sys.executable, str(FLOORS), "bare", "--port", str(port)], work, "bare", f"http://127.0.0.1:{port}/live"
    ) as (process, _):
        run_load(port, process.pid, hit_bodies, 16, 2000)  # warm-up
        return {
            "hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, requests),
            "hits_64_at_1000rps": run_load(port, process.pid, hit_bodies, CLIENTS, requests // 2, rate=1000),
        }


def bench_floors(work: Path, hit_bodies: Path, cache_path: Path, engine_port: int, hits: int, misses: int) -> dict:
    """The lookup floor's hits and the forwarder's misses (it forwards any body), 64 clients as for ours."""
    out = {}
    for name, extra, workload, requests, warm_up in (
        ("lookup_floor", ["lookup_floor", "--cache", str(cache_path)], "hits_64", hits, 2000),
        ("memory_floor", ["lookup_floor", "--cache", str(cache_path), "--in-memory"], "hits_64", hits, 2000),
        ("forwarder", ["forwarder", "--engine-port", str(engine_port)], "misses_64", misses, 320),
        (
            "forwarder_httpx",
            ["forwarder", "--engine-port", str(engine_port), "--client", "httpx"],
            "misses_64",
            misses,
            320,
        ),
        (
            "forwarder_streams",
            ["forwarder", "--engine-port", str(engine_port), "--client", "streams"],
            "misses_64",
            misses,
            320,
        ),
    ):
        port = free_port()
        with started(
            [sys.executable, str(FLOORS), *extra, "--port", str(port)], work, name, f"http://127.0.0.1:{port}/live"
        ) as (process, _):
            run_load(port, process.pid, hit_bodies, 16, warm_up)
            out[name] = {workload: run_load(port, process.pid, hit_bodies, CLIENTS, requests)}
    return out


def mirrorapi_command(
    args,
    port: int,
    engine_port: int,
    cache_path: Path | None,
    cache_url: str | None,
    log_file: Path,
    extra: list[str] = (),
    script: Path = REPO / "serving" / "main_mirrorapi.py",
) -> list[str]:
    store = ["--cache-url", cache_url] if cache_url else ["--cache-path", str(cache_path)]
    return [
        sys.executable,
        str(script),
        "--tools-folder",
        args.tools,
        *store,
        "--port",
        str(port),
        "--api-base",
        f"http://127.0.0.1:{engine_port}/v1",
        "--model",
        "stub",
        "--log-file",
        str(log_file),
        "--log-level",
        "warning",
        *extra,
    ]


def bench_mirrorapi(
    args,
    work: Path,
    name: str,
    hit_bodies: Path,
    miss_bodies: list[str],
    engine_port: int,
    cache_path: Path | None = None,
    cache_url: str | None = None,
    database_pid: int | None = None,
) -> dict:
    port = free_port()
    command = mirrorapi_command(args, port, engine_port, cache_path, cache_url, work / f"{name}-requests.jsonl")
    with started(command, work, name, f"http://127.0.0.1:{port}/live") as (process, startup):

        def measure(bodies: Path, clients: int, requests: int, rate: float = 0) -> dict:
            return run_load(port, process.pid, bodies, clients, requests, rate, database_pid=database_pid)

        result = {"startup_s": startup}
        measure(hit_bodies, 16, 2000)  # warm-up
        result["hits_1"] = measure(hit_bodies, 1, args.requests // 8)
        result["hits_64"] = measure(hit_bodies, CLIENTS, args.requests)
        result["hits_64_at_1000rps"] = measure(hit_bodies, CLIENTS, args.requests // 2, rate=1000)
        misses = work / f"{name}-misses.json"
        misses.write_text(json.dumps(miss_bodies))
        result["misses_64"] = measure(misses, CLIENTS, len(miss_bodies))
    return result


def bench_route(args, work: Path, hit_bodies: Path, engine_port: int, cache_path: Path) -> dict:
    """The same server with /virtual as a FastAPI route (bench/virtual_route.py): hits at 64 clients."""
    port = free_port()
    command = mirrorapi_command(
        args,
        port,
        engine_port,
        cache_path,
        None,
        work / "route-requests.jsonl",
        script=REPO / "bench" / "virtual_route.py",
    )
    with started(command, work, "mirrorapi-route", f"http://127.0.0.1:{port}/live") as (process, _):
        run_load(port, process.pid, hit_bodies, 16, 2000)  # warm-up
        return {"hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, args.requests)}


def bench_stabletoolbench(
    args, work: Path, folder: Path, hit_bodies: Path, miss_bodies: list[str], engine_port: int
) -> dict:
    port = free_port()
    home = work / "stb"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(folder, home / "tool_response_cache")
    config = {
        "api_key": "EMPTY",
        "api_base": f"http://127.0.0.1:{engine_port}/v1",
        "model": "stub",
        "temperature": 0,
        "toolbench_url": f"http://127.0.0.1:{engine_port}/rapidapi",
        "tools_folder": args.tools,
        "cache_folder": str(home / "tool_response_cache"),
        "is_save": True,
        "port": port,
        "log_file": str(home / "server.log"),
    }
    (home / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    server = Path(args.stabletoolbench).resolve() / "server"
    # Its own `__main__` binds 0.0.0.0; the same app on 127.0.0.1 (uvicorn as its requirements pin it).
    code = (
        f"import sys, uvicorn; sys.path.insert(0, {str(server)!r}); uvicorn.run('main:app', host='127.0.0.1', "
        f"port={port}, log_level='warning')"
    )
    env = dict(os.environ, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    probe = f"http://127.0.0.1:{port}/openapi.json"
    with started([args.stabletoolbench_python, "-c", code], work, "stabletoolbench", probe, cwd=home, env=env) as (
        process,
        _,
    ):
        run_load(port, process.pid, hit_bodies, 16, 400)  # warm-up
        result = {"hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, args.stb_requests)}
        misses = work / "stb-misses.json"
        misses.write_text(json.dumps(miss_bodies))
        result["misses_64"] = run_load(port, process.pid, misses, CLIENTS, len(miss_bodies))
    return result
