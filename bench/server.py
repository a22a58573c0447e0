"""Virtual API server benchmark: start-up, cache hits and cache misses; prints one JSON object.

    python bench/server.py [--tools ../shared/data/toolenv/toolenv2404] [--runs 3]

Workloads (issue 3), each run in a fresh server process (`serving/main_mirrorapi.py`, logging a
line per request to a file as in production) on a copy of a cache of 20,000 entries over 2,000
real APIs of the tools folder:
- start-up: process start until the server answers (/live), with the whole tools folder;
- hits: 1 and 64 closed-loop clients on keep-alive connections, random cached calls, and 64 clients
  paced to 1,000 requests/s together (above the 760/s StableToolBench's server tops out at);
- misses: 64 closed-loop clients, every call new, against a stub engine that answers every chat
  completion after a fixed 50 ms (a benchmark instrument, not a test double); afterwards every
  answered call must be in the cache (`entries_lost`).
The load generator and the stub engine are separate processes; server CPU is the server process's
own user+system time (/proc) over a workload, divided by its requests. Medians over `--runs`.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"hit_cpu_ms": 0.2, "hit_p99_ms_64": 10.0, "miss_rps_64": 1000, "miss_cpu_ms": 1.0, "startup_s": 5.0}
# Measured by the author on this machine with the same cache size and a 50 ms stub engine.
STABLETOOLBENCH = {"main_py_hits_rps_1": 1050, "main_py_hits_rps_64": 760, "main_py_hits_p99_ms_64": 216,
                   "main_py_hit_cpu_ms": "1.0-1.5", "mirrorapi_server_cpu_ms_per_call": 33,
                   "mirrorapi_server_rps_64": 55, "mirrorapi_server_p99_ms_64": 1900}
ENGINE_LATENCY = 0.05


# ------------------------------------------------------------------------------ stub engine
def stub_engine(port: int) -> None:
    """An OpenAI chat-completions endpoint answering after ENGINE_LATENCY (raw asyncio, to cost little CPU)."""
    content = json.dumps({"error": "", "response": {"status": "ok", "items": [{"id": 1, "name": "bench"}]}})
    body = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "stub",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if not head.startswith(b"GET"):
                    await asyncio.sleep(ENGINE_LATENCY)
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()
    _run(main())


# ---------------------------------------------------------------------------- load generator
def load(port: int, bodies_file: str, clients: int, requests: int, rate: float = 0) -> None:
    """`clients` keep-alive connections. Closed loop (rate 0): each sends its next request when
    answered. Paced (rate > 0): together they send `rate` requests per second, each on a fixed
    schedule, and latency counts from the scheduled time (a late server is not excused)."""
    bodies = [b.encode() for b in json.loads(Path(bodies_file).read_text())]
    latencies, statuses = [], {}
    interval = clients / rate if rate else 0.0

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
            writer.write(b"POST /virtual HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            status = "error" if json.loads(answer)["error"] else "ok"
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


# ------------------------------------------------------------------------------- orchestration
def build_cache(tools: str, path: Path, n_apis: int = 2000, per_api: int = 10) -> list[dict]:
    """20,000 entries over 2,000 APIs spread over the folder; returns the agent bodies of the hits."""
    sys.path.insert(0, str(REPO))
    from mirrorapi.records import canonical_json
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
            rows.append((doc.category, doc.tool, doc.api, canonical_json(arguments), "", text))
            bodies.append({"category": doc.category, "tool_name": doc.tool, "api_name": doc.api,
                           "tool_input": json.dumps(arguments, indent=2), "strip": "truncate", "toolbench_key": ""})
    cache = ResponseCache(path)
    cache.put_many(rows, "imported:bench")
    cache.close()
    return bodies


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(port: int, server_pid: int, bodies: Path, clients: int, requests: int, rate: float = 0) -> dict:
    before = cpu_seconds(server_pid)
    out = subprocess.run([sys.executable, __file__, "--role", "load", "--port", str(port), "--bodies", str(bodies),
                          "--clients", str(clients), "--requests", str(requests), "--rate", str(rate)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    result["server_cpu_ms_per_request"] = (cpu_seconds(server_pid) - before) * 1e3 / result["requests"]
    return result


def one_run(args, work: Path, base_cache: Path, hit_bodies: Path, miss_bodies: list, engine_port: int) -> dict:
    from mirrorapi.processes import free_port, wait_until_ready

    cache = work / "cache.sqlite"
    shutil.copy(base_cache, cache)
    port = free_port()
    command = [sys.executable, str(REPO / "serving" / "main_mirrorapi.py"), "--tools-folder", args.tools,
               "--cache-path", str(cache), "--port", str(port), "--api-base", f"http://127.0.0.1:{engine_port}/v1",
               "--model", "stub"]
    log = open(work / "server.log", "w")
    start = time.perf_counter()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/live", 120, process=server, log_path=work / "server.log",
                         interval=0.02)
        result = {"startup_s": time.perf_counter() - start}
        run_load(port, server.pid, hit_bodies, 16, 2000)  # warm-up
        result["hits_1"] = run_load(port, server.pid, hit_bodies, 1, args.requests // 4)
        result["hits_64"] = run_load(port, server.pid, hit_bodies, 64, args.requests)
        result["hits_64_at_1000rps"] = run_load(port, server.pid, hit_bodies, 64, args.requests // 2, rate=1000)
        misses = work / "misses.json"
        misses.write_text(json.dumps(miss_bodies))
        result["misses_64"] = run_load(port, server.pid, misses, 64, len(miss_bodies))
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    from mirrorapi.serving.cache import ResponseCache
    stored = ResponseCache(cache)
    result["misses_64"]["entries_lost"] = result["misses_64"]["statuses"].get("ok", 0) - (stored.count() - 20000)
    stored.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20000, help="Hit requests per 64-client workload.")
    parser.add_argument("--misses", type=int, default=6400, help="Miss requests per run.")
    parser.add_argument("--role", choices=["bench", "stub-engine", "load"], default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bodies", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "stub-engine":
        return stub_engine(args.port)
    if args.role == "load":
        return load(args.port, args.bodies, args.clients, args.requests, args.rate)
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/server.py: tools folder not found: {args.tools}")
    sys.path.insert(0, str(REPO))
    from mirrorapi.processes import free_port
    from mirrorapi.versions import package_versions

    work = Path(tempfile.mkdtemp(prefix="mirrorapi-bench-"))
    engine_port = free_port()
    engine = subprocess.Popen([sys.executable, __file__, "--role", "stub-engine", "--port", str(engine_port)])
    try:
        bodies = build_cache(args.tools, work / "base.sqlite")
        hit_bodies = work / "hits.json"
        hit_bodies.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        runs = []
        for run in range(args.runs):
            misses = [json.dumps({**b, "tool_input": json.dumps({"run": run, "miss": i, **json.loads(b["tool_input"])})})
                      for i, b in enumerate(bodies[: args.misses])]
            runs.append(one_run(args, work, work / "base.sqlite", hit_bodies, misses, engine_port))
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    def median(path):
        values = [r[path[0]][path[1]] if len(path) == 2 else r[path[0]] for r in runs]
        return round(statistics.median(values), 4)
    result = {"tools_folder": args.tools, "cache_entries": 20000, "apis": 2000, "runs": args.runs,
              "startup_s": median(["startup_s"])}
    for workload in ("hits_1", "hits_64", "hits_64_at_1000rps", "misses_64"):
        result[workload] = {k: median([workload, k]) for k in ("rps", "p50_ms", "p99_ms", "server_cpu_ms_per_request")}
    result["misses_64"]["entries_lost"] = sum(r["misses_64"]["entries_lost"] for r in runs)
    result["misses_64"]["error_answers"] = sum(r["misses_64"]["statuses"].get("error", 0) for r in runs)
    result["per_run"] = runs
    result["targets"] = TARGETS
    result["meets_targets"] = {
        "hit_cpu_ms": result["hits_64"]["server_cpu_ms_per_request"] <= TARGETS["hit_cpu_ms"],
        "hit_p99_ms_64": result["hits_64"]["p99_ms"] <= TARGETS["hit_p99_ms_64"],
        "hit_p99_ms_64_at_1000rps": result["hits_64_at_1000rps"]["p99_ms"] <= TARGETS["hit_p99_ms_64"],
        "miss_rps_64": result["misses_64"]["rps"] >= TARGETS["miss_rps_64"],
        "miss_cpu_ms": result["misses_64"]["server_cpu_ms_per_request"] <= TARGETS["miss_cpu_ms"],
        "startup_s": result["startup_s"] <= TARGETS["startup_s"],
    }
    result["stabletoolbench_reference"] = STABLETOOLBENCH
    result["versions"] = package_versions()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
