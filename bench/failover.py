"""Engine failover benchmark: cache misses against one hung and one healthy replica; prints one JSON object.

    python bench/failover.py [--seconds 8] [--clients 16] [--attempt-timeout 2] [--cooldown 2]

A real virtual server process (`serving/main_mirrorapi.py`, the bundled sample tools, a fresh cache)
is given `api_base: [hung, healthy]`. The hung replica is a fake engine (a fault a real one cannot be
made to show on demand): it accepts connections and never answers. The healthy one is a stub engine
(harness/fake_engines.py), answering every chat completion after 50 ms (a benchmark
instrument). `--clients` closed-loop clients send misses (every call new) for `--seconds`; the cool-down is shorter
than the run, so the hung replica is probed again several times while the load runs.

Target (issue 11): 100% of misses succeed, each within attempt timeout + engine latency.
"""

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_load import load_average

REPO = Path(__file__).resolve().parents[1]
ENGINE_LATENCY = 0.05  # the healthy replica's (a StubEngine's) answer time


def miss_bodies(n: int) -> list[dict]:
    """`n` calls nobody has made, spread over the sample tools' APIs (required arguments filled)."""
    sys.path.insert(0, str(REPO))
    from mirrorapi.tools import ToolRegistry

    docs = sorted(ToolRegistry.load([REPO / "data" / "samples" / "tools"]), key=lambda d: (d.category, d.tool, d.api))
    bodies = []
    for i in range(n):
        doc = docs[i % len(docs)]
        arguments = {name: f"failover {i}" for name in doc.parameter_names()[0]} | {"bench_call": i}
        bodies.append(
            {"category": doc.category, "tool_name": doc.tool, "api_name": doc.api, "tool_input": json.dumps(arguments)}
        )
    return bodies


async def load(url: str, clients: int, seconds: float) -> list[tuple[float, int, str]]:
    """Closed loop: (latency s, HTTP status, error string) of every miss sent."""
    import httpx

    bodies = iter(miss_bodies(50_000))
    results = []
    stop_at = time.monotonic() + seconds

    async def client(http):
        while time.monotonic() < stop_at:
            start = time.monotonic()
            response = await http.post(url + "/virtual", json=next(bodies))
            results.append((time.monotonic() - start, response.status_code, response.json()["error"]))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seconds", type=float, default=8.0, help="How long the clients send misses.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--attempt-timeout", type=float, default=2.0, help="engine_attempt_timeout of the server.")
    parser.add_argument("--cooldown", type=float, default=2.0, help="engine_cooldown of the server.")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from harness.fake_engines import HungEngine, stub_engine_process
    from harness.processes import checkout_env, free_port, wait_until_ready
    from mirrorapi.versions import package_versions

    work = Path(tempfile.mkdtemp(prefix="mirrorapi-failover-"))
    hung, engine_port, port = HungEngine(), free_port(), free_port()
    healthy = f"http://127.0.0.1:{engine_port}/v1"
    processes = [stub_engine_process(engine_port, ENGINE_LATENCY)]
    command = [
        sys.executable,
        str(REPO / "serving" / "main_mirrorapi.py"),
        "--tools-folder",
        str(REPO / "data" / "samples" / "tools"),
        "--cache-path",
        str(work / "cache.sqlite"),
        "--port",
        str(port),
        "--api-base",
        hung.url,
        healthy,
        "--model",
        "stub",
        "--engine-timeout",
        "30",
        "--engine-retries",
        "2",
        "--engine-attempt-timeout",
        str(args.attempt_timeout),
        "--engine-cooldown",
        str(args.cooldown),
        "--log-level",
        "warning",
    ]
    log = open(work / "server.log", "w")
    processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=checkout_env()))
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/live", 60, process=processes[-1], log_path=work / "server.log")
        load_before = load_average()
        results = asyncio.run(load(f"http://127.0.0.1:{port}", args.clients, args.seconds))
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(30)
        log.close()
        hung.close()
        shutil.rmtree(work, ignore_errors=True)
    latencies = sorted(r[0] for r in results)
    succeeded = [r for r in results if r[1] == 200 and not r[2]]
    bound = args.attempt_timeout + ENGINE_LATENCY
    # A call that met the hung replica waited out its whole attempt timeout before the other replica answered it:
    # by latency alone, slower ones under load are still the others (half the timeout counted 1.3 s misses).
    slow = [r[0] for r in results if r[0] >= args.attempt_timeout]  # the calls that met the hung replica
    others = sorted(r[0] for r in results if r[0] < args.attempt_timeout)  # the engine latency seen here
    errors: dict[str, int] = {}
    for _, status, error in results:
        if error:
            errors[f"{status} {error}"] = errors.get(f"{status} {error}", 0) + 1
    print(
        json.dumps(
            {
                "versions": package_versions(),
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "misses": len(results),
                "succeeded": len(succeeded),
                "success_rate": round(len(succeeded) / len(results), 4),
                "clients": args.clients,
                "seconds": args.seconds,
                "attempt_timeout_s": args.attempt_timeout,
                "cooldown_s": args.cooldown,
                "engine_latency_s": ENGINE_LATENCY,
                "bound_s": bound,
                "within_bound": sum(x <= bound for x in latencies),
                "latency_ms": {
                    "p50": round(latencies[len(latencies) // 2] * 1e3, 1),
                    "p99": round(latencies[int(len(latencies) * 0.99)] * 1e3, 1),
                    "max": round(latencies[-1] * 1e3, 1),
                },
                "misses_that_met_the_hung_replica": len(slow),
                "their_latency_ms": sorted(round(x * 1e3, 1) for x in slow),
                # Under load the healthy engine's answer takes longer than its 50 ms: the bound with the latency
                # the other misses saw (their slowest) is what the target means on a busy machine.
                "other_misses_latency_ms": {
                    "p50": round(others[len(others) // 2] * 1e3, 1) if others else None,
                    "max": round(others[-1] * 1e3, 1) if others else None,
                },
                "met_hung_within_attempt_timeout_plus_slowest_other": sum(
                    x <= args.attempt_timeout + (others[-1] if others else ENGINE_LATENCY) for x in slow
                ),
                "hung_replica_connections": hung.connections,  # attempts plus background probes
                "errors": errors,
            }
        )
    )


if __name__ == "__main__":
    main()
