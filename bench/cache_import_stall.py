"""How long a concurrent `mirrorapi cache import` stalls the server's requests; prints one JSON object.

    python bench/cache_import_stall.py [--pairs ../shared/data/pairs/api-bank-generated.jsonl] [--rate 200]

A server (`serving/main_mirrorapi.py`, the bundled sample tools, a stub engine answering every chat
completion after 50 ms: harness/fake_engines.py's benchmark instrument) on a cache seeded with the real
API-Bank pairs. 20 paced keep-alive connections send `--rate` requests/s together: 16 send hits (seeded
calls), 4 send misses (new calls: simulated, then stored by the writer thread before they are answered). Two seconds
in, `mirrorapi cache import PAIRS --cache <the server's cache>` runs in its own process (20,000 real
pairs); the load goes on until one second after it ends. Then the same with the import done as one
long transaction (what `put_many` did before it committed in slices), for comparison.

Reported per import: its duration, the worst and p99 latency of hits during the import, the worst
stall of misses (latency minus the engine's 50 ms), the same two over the two seconds before the
import (what the machine itself costs), and answers lost (answered, yet not in the cache afterwards).
Target: no request stalled more than 100 ms.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_load import http_request, load_average, read_answer

REPO = Path(__file__).resolve().parents[1]
TARGET_STALL_MS = 100.0
ENGINE_LATENCY = 0.05  # the stub engine's answer time
SAMPLE_TOOLS = REPO / "data" / "samples" / "tools"
# The modules that read the slice size are patched where they read it (each imported the name).
ONE_TRANSACTION = """
import sys
import mirrorapi.serving.cache as cache_module
import mirrorapi.serving.cache.sqlite as sqlite_module
import mirrorapi.serving.cache.store as store_module
from mirrorapi.tools import ToolRegistry
store_module.IMPORT_TRANSACTION_ROWS = sqlite_module.IMPORT_TRANSACTION_ROWS = 10 ** 9  # one transaction, as before
cache = cache_module.ResponseCache(sys.argv[2])
print(cache_module.import_pairs(cache, sys.argv[1], registry=ToolRegistry.load([sys.argv[3]])))
cache.close()
"""


async def _client(port: int, schedule: list[tuple[float, str, bytes]], results: list) -> None:
    """One keep-alive connection sending its requests at their scheduled times (latency counts from then)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for at, kind, body in schedule:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        writer.write(http_request(port, "/virtual", body))
        status, text = await read_answer(reader)
        if status != 200:  # a refusal of the benchmark's own request: nothing to measure
            raise RuntimeError(f"the server refused a request with HTTP {status}: {text[:200]!r}")
        answer = json.loads(text)
        results.append((at, time.perf_counter() - at, kind, not answer["error"], body))
    writer.close()


async def _under_import(
    port: int, hits: list[bytes], misses: list[bytes], rate: float, import_command: list[str], clients: int = 20
) -> dict:
    """Load at `rate` req/s; the import starts after 2 s; the load stops 1 s after it ends."""
    results: list = []
    interval = clients / rate
    rng = random.Random(7)
    start = time.perf_counter() + 0.2

    def schedule(c: int, n: int) -> list:
        # Hits and misses on connections of their own: a miss waiting for its commit must not hold
        # back the hits queued behind it on a keep-alive connection (that would be the client's stall).
        kind = "miss" if c % 5 == 0 else "hit"
        return [
            (start + c * interval / clients + i * interval, kind, misses.pop() if kind == "miss" else rng.choice(hits))
            for i in range(n)
        ]

    horizon = 120  # seconds of load scheduled at most; cancelled once the import is over
    tasks = [asyncio.create_task(_client(port, schedule(c, int(horizon / interval)), results)) for c in range(clients)]
    await asyncio.sleep(2.2)
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *import_command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    ended = time.perf_counter()
    if process.returncode != 0:
        raise SystemExit(f"import failed: {output.decode()[-500:]}")
    await asyncio.sleep(1.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    during = [r for r in results if began <= r[0] + r[1] and r[0] <= ended]
    hit_ms = sorted(r[1] * 1e3 for r in during if r[2] == "hit")
    miss_stall_ms = sorted(max(0.0, r[1] - ENGINE_LATENCY) * 1e3 for r in during if r[2] == "miss")
    before = [r for r in results if r[0] + r[1] < began]
    return {
        "import_s": round(ended - began, 2),
        "requests_during_import": len(during),
        "hit_max_ms": round(hit_ms[-1], 1),
        "hit_p99_ms": round(hit_ms[int(len(hit_ms) * 0.99)], 1),
        "miss_max_stall_ms": round(miss_stall_ms[-1], 1),
        "max_stall_ms": round(max(hit_ms[-1], miss_stall_ms[-1]), 1),
        "requests_over_target": sum(ms > TARGET_STALL_MS for ms in hit_ms + miss_stall_ms),
        "before_import": {
            "hit_max_ms": round(max(r[1] for r in before if r[2] == "hit") * 1e3, 1),
            "miss_max_stall_ms": round(
                max(max(0.0, r[1] - ENGINE_LATENCY) for r in before if r[2] == "miss") * 1e3, 1
            ),
        },
        "answered_misses": [r[4] for r in results if r[2] == "miss" and r[3]],
        "import_output": output.decode().strip().splitlines()[-1][:300],
    }


def one_import(args, work: Path, engine_port: int, name: str, import_command) -> dict:
    sys.path.insert(0, str(REPO))
    from harness.processes import free_port, wait_until_ready
    from mirrorapi.records import canonical_json
    from mirrorapi.serving.cache import ResponseCache, import_pairs
    from mirrorapi.tools import ToolRegistry

    db = work / f"{name}.sqlite"
    registry = ToolRegistry.load([SAMPLE_TOOLS])
    seed = ResponseCache(db)
    import_pairs(seed, args.seed_pairs, registry=registry)
    seed.close()
    hits = [
        json.dumps(
            {
                "category": p["category"],
                "tool_name": p["tool_name"],
                "api_name": p["api_name"],
                "tool_input": json.dumps(p["tool_input"]),
            }
        ).encode()
        for p in map(json.loads, open(args.seed_pairs, encoding="utf-8"))
    ]
    misses = [
        json.dumps(
            {
                "category": "APIBank",
                "tool_name": "apibank_search",
                "api_name": "SearchEngine",
                "tool_input": json.dumps({"keyword": f"{name} miss {i}"}),
            }
        ).encode()
        for i in range(20000)
    ]
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "serving/main_mirrorapi.py"),
            "--tools-folder",
            str(SAMPLE_TOOLS),
            "--cache-path",
            str(db),
            "--port",
            str(port),
            "--api-base",
            f"http://127.0.0.1:{engine_port}/v1",
            "--log-level",
            "warning",
            "--missing-required",
            "simulate",
        ]
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/health", 60, process=server)
        result = _under_import(port, hits, misses, args.rate, import_command(db))
        result = asyncio.run(result)
    finally:
        server.terminate()
        server.wait(60)
    stored = ResponseCache(db)
    (identity,) = stored.identities()  # the server's: every miss was simulated by it
    result["answers_lost"] = sum(
        stored.get(
            "APIBank",
            "apibank_search",
            "searchengine",
            canonical_json(json.loads(json.loads(body)["tool_input"])),
            identity,
            count_hit=False,
        )
        is None
        for body in result["answered_misses"]
    )
    result["answered_misses"] = len(result.pop("answered_misses"))
    stored.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--pairs",
        default=str(REPO.parent / "shared/data/pairs/api-bank-generated.jsonl"),
        help="Pairs file the concurrent import reads.",
    )
    parser.add_argument(
        "--seed-pairs",
        default=str(REPO.parent / "shared/data/pairs/api-bank.jsonl"),
        help="Pairs the server's cache holds before (its hits).",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="Requests per second (1 in 5 a miss).")
    args = parser.parse_args()
    for path in (args.pairs, args.seed_pairs):
        if not Path(path).is_file():
            sys.exit(f"bench/cache_import_stall.py: pairs file not found: {path}")
    sys.path.insert(0, str(REPO))
    from harness.fake_engines import stub_engine_process
    from harness.processes import checkout_env, free_port
    from mirrorapi.versions import package_versions

    # The server and the import run this checkout's code.
    os.environ["PYTHONPATH"] = checkout_env()["PYTHONPATH"]
    work = Path(tempfile.mkdtemp(prefix="mirrorapi-stall-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, ENGINE_LATENCY)
    load_before = load_average()
    try:
        sliced = one_import(
            args,
            work,
            engine_port,
            "sliced",
            lambda db: [
                sys.executable,
                "-m",
                "mirrorapi.cli",
                "cache",
                "import",
                args.pairs,
                "--cache",
                str(db),
                "--tools",
                str(SAMPLE_TOOLS),
            ],
        )
        one_transaction = one_import(
            args,
            work,
            engine_port,
            "one_transaction",
            lambda db: [sys.executable, "-c", ONE_TRANSACTION, args.pairs, str(db), str(SAMPLE_TOOLS)],
        )
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "rate_rps": args.rate,
                "import_pairs": args.pairs,
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "target_max_stall_ms": TARGET_STALL_MS,
                "mirrorapi_cache_import": sliced,
                "one_transaction_import_for_comparison": one_transaction,
                "meets_target": sliced["max_stall_ms"] <= TARGET_STALL_MS and sliced["answers_lost"] == 0,
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
