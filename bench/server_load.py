"""bench/server.py's load generator (run as a process of its own: `run_load` starts it and measures the server's CPU
over its run) and what it measures with.

The generator holds `--clients` keep-alive connections over asyncio streams, the cheapest HTTP/1.1 client Python
has (on these 2 cores it shares the machine with the server it measures; bench/server_floors.py's `forwarder`
measures it against aiohttp and httpx), and prints one JSON line: requests, requests/s, statuses (ok, error: an
error observation, http_<code>: a refusal, connection_error: a connection refused, reset or closed before the
answer; `run_load` measures neither of the last two), p50 and p99 (of the answered requests).
Server CPU is the server's own user+system time (/proc, with its child processes) over a workload, divided by its
requests.
"""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def http_request(port: int, path: str, body: bytes, headers: bytes = b"") -> bytes:
    """An HTTP/1.1 POST of JSON `body` to 127.0.0.1:`port`, naming that address as its Host (the server answers a
    Host that is not this machine's with 421, as it should a DNS-rebinding page: a benchmark must not send one)."""
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
        % (path.encode(), port, headers, len(body), body)
    )


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of the next HTTP/1.1 answer on a kept-alive connection (every server here sends
    Content-Length)."""
    status, body, _ = await _read_answer(reader)
    return status, body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the server closes the connection after it: `connection: close`)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = [line.lower() for line in head.split(b"\r\n")]
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:"))
    closes = any(line.startswith(b"connection:") and b"close" in line for line in lines)
    return int(head.split(b" ", 2)[1]), await reader.readexactly(length), closes


def load(port: int, bodies_file: str, clients: int, requests: int, rate: float = 0, path: str = "/virtual") -> None:
    """`clients` keep-alive connections. Closed loop (rate 0): each sends its next request when
    answered. Paced (rate > 0): together they send `rate` requests per second, each on a fixed
    schedule, and latency counts from the scheduled time (a late server is not excused)."""
    bodies = [b.encode() for b in json.loads(Path(bodies_file).read_text())]
    latencies, statuses = [], {}
    interval = clients / rate if rate else 0.0

    async def client(offset: int, n: int):
        connection = None  # (reader, writer), opened again after the server closed it
        scheduled = time.perf_counter() + interval * offset / clients
        for i in range(n):
            body = bodies[(offset + i * clients) % len(bodies)]
            if interval:
                await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
                start, scheduled = scheduled, scheduled + interval
            else:
                start = time.perf_counter()
            try:
                connection = connection or await asyncio.open_connection("127.0.0.1", port)
                connection[1].write(http_request(port, path, body))
                code, answer, closes = await _read_answer(connection[0])
            except (OSError, EOFError, ValueError, StopIteration):  # refused, reset, closed, or no HTTP answer
                statuses["connection_error"] = statuses.get("connection_error", 0) + 1
                if connection:
                    connection[1].close()
                connection = None
                continue
            latencies.append(time.perf_counter() - start)
            status = f"http_{code}" if code != 200 else "error" if json.loads(answer).get("error") else "ok"
            statuses[status] = statuses.get(status, 0) + 1
            if closes:  # a refusal may close the connection (a 500 with `connection: close`): the next opens one
                connection[1].close()
                connection = None
        if connection:
            connection[1].close()

    async def main():
        start = time.perf_counter()
        await asyncio.gather(*(client(c, requests // clients) for c in range(clients)))
        return time.perf_counter() - start

    elapsed = _run(main())
    latencies.sort()
    print(
        json.dumps(
            {
                "requests": len(latencies),
                "rps": len(latencies) / elapsed,
                "statuses": statuses,
                "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else None,
                "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else None,
            }
        )
    )


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


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


def run_load(
    port: int,
    server_pid: int,
    bodies: Path,
    clients: int,
    requests: int,
    rate: float = 0,
    path: str = "/virtual",
    database_pid: int | None = None,
) -> dict:
    """`database_pid`: a PostgreSQL store's postmaster; its CPU (the backends serving the server) is given apart."""
    before = cpu_seconds(server_pid)
    database_before = cpu_seconds(database_pid) if database_pid else 0.0
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--port",
            str(port),
            "--bodies",
            str(bodies),
            "--clients",
            str(clients),
            "--requests",
            str(requests),
            "--rate",
            str(rate),
            "--path",
            path,
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        tail = out.stderr.strip()[-2000:]
        raise RuntimeError(f"the load generator (bench/server_load.py) exited with status {out.returncode}:\n{tail}")
    result = json.loads(out.stdout)
    if refused := {status: n for status, n in result["statuses"].items() if status not in ("ok", "error")}:
        # Every server measured here answers 200 (an error observation included): any other status (http_<code>, or
        # connection_error: a server that closed or reset the connection, or is gone) is a refusal of
        # the benchmark's own requests, and figures over refusals measure nothing.
        raise RuntimeError(f"the server refused the benchmark's requests ({refused}): nothing was measured")
    if not result["requests"]:
        raise RuntimeError(f"no request was sent ({requests} requests over {clients} clients): nothing was measured")
    result["server_cpu_ms_per_request"] = (cpu_seconds(server_pid) - before) * 1e3 / result["requests"]
    if database_pid:
        result["database_cpu_ms_per_request"] = (
            (cpu_seconds(database_pid) - database_before) * 1e3 / result["requests"]
        )
    return result


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median_of(runs: list[dict]) -> dict:
    """The median of every number over runs, keeping the nesting; other values from the first run that has them.
    A key some runs lack (a status only some runs got) counts 0 in those runs, a nested one is empty there.
    A ratio of two figures is the median of the runs' own ratios (`median_of(per-run ratios)`), not a ratio of
    two medians, which may come from different runs."""
    keys = list(dict.fromkeys(key for run in runs for key in run))
    out = {}
    for key in keys:
        value = next(run[key] for run in runs if key in run)
        if isinstance(value, dict):
            out[key] = median_of([r.get(key) or {} for r in runs])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = round(statistics.median(r.get(key, 0) for r in runs), 4)
        else:
            out[key] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bodies", required=True, help="A JSON list of request bodies, sent in turn.")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0, help="Requests/s of all clients together (0: closed loop).")
    parser.add_argument("--path", default="/virtual")
    args = parser.parse_args()
    load(args.port, args.bodies, args.clients, args.requests, args.rate, args.path)


if __name__ == "__main__":
    main()
