"""Large requests against everyone else's: how long a tiny request waits while other clients send calls of
about a megabyte each, by the door they come through (`/virtual`, an OpenEnv step over HTTP `/step`, one on the
WebSocket `/ws`). A body of 64 KiB or more is parsed in the server's worker process (`LargeBodies`); parsed on
the event loop it held every other request. Prints one JSON object.

    .venv/bin/python bench/large_bodies.py [--clients 8] [--seconds 8] [--kilobytes 890]

One real server process (`serving/main_mirrorapi.py`, the sample tools, a new SQLite cache, a stub engine process
answering at once). For each door in turn, `--clients` clients each send the same large call over and over (its
arguments a list of small objects, the costliest JSON to parse per byte; an unknown argument, so every call is a
miss: the simulator's stub answers it), while one more client asks `GET /state` of a small HTTP episode every
20 ms; then the same probe with nothing else running. The figures are that probe's latencies (median, 99th
percentile, most) and the large calls answered in the time. Client and server share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "data" / "samples" / "tools"
TOOLSET = "tool=APIBank/apibank_account"
PROBE_INTERVAL = 0.02


def large_arguments(kilobytes: int) -> dict:
    """About `kilobytes` thousand bytes of JSON (an item `{"k": 12345, "v": "abcdefgh"}, ` is about 31)."""
    return {"token": "t", "blob": [{"k": i, "v": "abcdefgh"} for i in range(kilobytes * 1000 // 31)]}


async def run_door(url: str, door: str | None, clients: int, seconds: float, kilobytes: int) -> dict:
    import httpx
    from websockets.asyncio.client import connect

    arguments = large_arguments(kilobytes)
    stop, waits, answered = asyncio.Event(), [], []
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients + 4)) as http:
        await http.post("/reset", json={"toolset": TOOLSET, "episode_id": "probe"})

        async def probe() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                reply = await http.get("/state", params={"episode_id": "probe"})
                assert reply.status_code == 200, reply.text
                waits.append(time.perf_counter() - start)
                await asyncio.sleep(PROBE_INTERVAL)

        async def sender(index: int) -> None:
            action = {"type": "call_tool", "tool_name": "checktoken", "arguments": arguments}
            if door == "virtual":
                body = json.dumps(
                    {
                        "category": "APIBank",
                        "tool_name": "apibank_account",
                        "api_name": "CheckToken",
                        "tool_input": arguments,
                    }
                )
                while not stop.is_set():
                    reply = await http.post("/virtual", content=body, headers={"content-type": "application/json"})
                    answered.append(reply.status_code == 200)
            elif door == "http_step":
                episode = f"large-{index}"
                await http.post("/reset", json={"toolset": TOOLSET, "episode_id": episode})
                body = json.dumps({"episode_id": episode, "action": action})
                while not stop.is_set():
                    reply = await http.post("/step", content=body, headers={"content-type": "application/json"})
                    answered.append(reply.status_code == 200)
            else:
                async with connect(url.replace("http", "ws") + "/ws", max_size=None) as ws:
                    await ws.send(json.dumps({"type": "reset", "data": {"toolset": TOOLSET}}))
                    await ws.recv()
                    message = json.dumps({"type": "step", "data": action})
                    while not stop.is_set():
                        await ws.send(message)
                        answered.append(json.loads(await ws.recv())["type"] == "observation")

        tasks = [asyncio.create_task(probe())]
        if door is not None:
            tasks += [asyncio.create_task(sender(i)) for i in range(clients)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
    waits.sort()
    return {
        "probe_requests": len(waits),
        "probe_ms_p50": round(1000 * waits[len(waits) // 2], 1),
        "probe_ms_p99": round(1000 * waits[int(0.99 * (len(waits) - 1))], 1),
        "probe_ms_max": round(1000 * waits[-1], 1),
        "large_calls_answered": sum(answered),
        "large_calls_failed": len(answered) - sum(answered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--clients", type=int, default=8, help="Clients sending large calls at once.")
    parser.add_argument("--seconds", type=float, default=8.0, help="How long each door is measured.")
    parser.add_argument("--kilobytes", type=int, default=890, help="About how large each call's arguments are.")
    parser.add_argument(
        "--doors", nargs="+", choices=["virtual", "http_step", "ws_step"], default=["virtual", "http_step", "ws_step"]
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from harness.fake_engines import stub_engine_process
    from harness.processes import checkout_env, free_port, stop, wait_until_ready

    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "body_bytes": len(json.dumps(large_arguments(args.kilobytes))),
        "clients": args.clients,
        "seconds_per_door": args.seconds,
        "doors": {},
    }
    with tempfile.TemporaryDirectory(prefix="mirrorapi-large-bodies-") as work:
        engine_port, port = free_port(), free_port()
        engine = stub_engine_process(engine_port, 0.0)
        log = Path(work) / "server.log"
        command = [
            sys.executable, "serving/main_mirrorapi.py", "--tools-folder", str(TOOLS),
            "--cache-path", str(Path(work) / "cache.sqlite"), "--port", str(port),
            "--api-base", f"http://127.0.0.1:{engine_port}/v1", "--model", "stub", "--log-level", "warning",
            "--max-arguments-chars", "2000000", "--unknown-arguments", "simulate",
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with open(log, "w") as out:
            server = subprocess.Popen(
                command, cwd=REPO, env=checkout_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_until_ready(url + "/live", 300, process=server, log_path=log)
            time.sleep(5)  # the worker process that parses large bodies starts in the background
            result["doors"]["idle"] = asyncio.run(run_door(url, None, 0, args.seconds, args.kilobytes))
            for door in args.doors:
                result["doors"][door] = asyncio.run(run_door(url, door, args.clients, args.seconds, args.kilobytes))
                print(json.dumps({door: result["doors"][door]}), file=sys.stderr, flush=True)
        finally:
            stop(server, grace=30)
            stop(engine)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
