"""Where a cache hit's server CPU goes: the real server with parts swapped out, side by side in one run; one JSON.

    python bench/hit_parts.py [--runs 2] [--tools ../shared/data/toolenv/toolenv2404]

bench/server.py's hit workload (20,000 cached entries, 64 closed-loop clients, its load generator in a process
of its own) against, per run, one fresh server of each variant:
- bare: bench/server.py's bare app (a constant body; uvicorn, uvloop, httptools);
- transport: the same constant answer behind the server's own uvicorn options (the receive deadline protocol);
- endpoint: the real server, `VirtualApi.answer` replaced by a constant answer (the /virtual endpoint, metrics
  and the request log line remain);
- no_metrics, no_log_line, neither: the real server without the metrics, the log line, or both;
- server: the real server, as `serving/main_mirrorapi.py` runs it.
Each differs from `server` in what it leaves out; the differences of their CPU per hit are what those parts
cost (medians over `--runs`, the variants alternating within each run).
"""

import argparse
import json
import random
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("bare", "transport", "endpoint", "no_metrics", "no_log_line", "neither", "server")
sys.path.insert(0, str(REPO))  # the library and the harnesses of this clone

# bench/server.py's instruments, servers and workloads (siblings of this script)
import server_floors  # noqa: E402
import server_load  # noqa: E402
import server_workloads  # noqa: E402


def serve_variant(variant: str, argv: list[str]) -> None:
    """Run the server of `argv` (its flags) with `variant`'s parts swapped out."""
    import uvicorn

    from mirrorapi.serving import app as server
    from mirrorapi.serving.answer import Answer
    from mirrorapi.serving.config import add_server_arguments, settings_from_args
    from mirrorapi.serving.handler import VirtualApi
    from mirrorapi.serving.observability import RequestLogWriter, ServerMetrics
    from mirrorapi.serving.transport import uvicorn_options

    settings = settings_from_args(add_server_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv))
    if variant == "endpoint":

        async def constant(self, body, session_id=None, client_gone=None):  # VirtualApi.answer's arguments
            return Answer(200, server_floors.BARE_BODY, "hit", stages={"total": 0.0})

        VirtualApi.answer = constant
    if variant in ("no_metrics", "neither"):
        ServerMetrics.record = lambda self, answer: None
    if variant in ("no_log_line", "neither"):
        RequestLogWriter.record = lambda self, answer: None
    app = server.create_app(settings)
    uvicorn.run(server_floors.bare_app if variant == "transport" else app, **uvicorn_options(settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16000, help="Hit requests per server.")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    sys.path.insert(0, str(REPO))
    if args.variant:
        return serve_variant(args.variant, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/hit_parts.py: tools folder not found: {args.tools}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops the servers and the engine
    from harness.fake_engines import stub_engine_process
    from harness.processes import free_port
    from mirrorapi.versions import package_versions

    work = Path(tempfile.mkdtemp(prefix="mirrorapi-bench-hit-parts-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, server_workloads.ENGINE_LATENCY)  # never asked: every call is a hit
    load_before = server_load.load_average()
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        bodies = server_workloads.build_cache(args.tools, work / "base.sqlite")
        hits = work / "hits.json"
        hits.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        for _ in range(args.runs):
            for variant in VARIANTS:
                shutil.copy(work / "base.sqlite", work / "cache.sqlite")
                port = free_port()
                if variant == "bare":
                    command = [sys.executable, str(server_workloads.FLOORS), "bare", "--port", str(port)]
                else:
                    command = server_workloads.mirrorapi_command(
                        args,
                        port,
                        engine_port,
                        work / "cache.sqlite",
                        None,
                        work / "requests.jsonl",
                        extra=["--variant", variant],
                        script=Path(__file__),
                    )
                with server_workloads.started(command, work, variant, f"http://127.0.0.1:{port}/live") as (process, _):
                    server_load.run_load(port, process.pid, hits, 16, 2000)  # warm-up
                    result = server_load.run_load(port, process.pid, hits, server_workloads.CLIENTS, args.requests)
                cpu[variant].append(result["server_cpu_ms_per_request"] * 1000)
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    us = {v: round(statistics.median(cpu[v]), 1) for v in VARIANTS}

    def part(more: str, less: str) -> float:  # each run's difference, then their median (the runs' load differs)
        return round(statistics.median(a - b for a, b in zip(cpu[more], cpu[less], strict=True)), 1)

    print(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "load_average_before": load_before,
                "load_average_after": server_load.load_average(),
                "clients": server_workloads.CLIENTS,
                "runs": args.runs,
                "cpu_us_per_hit": us,
                "parts_us": {
                    "uvicorn_and_a_constant_answer": us["bare"],
                    "receive_deadline_and_options": part("transport", "bare"),
                    "virtual_endpoint_metrics_and_log_line": part("endpoint", "transport"),
                    "metrics": part("server", "no_metrics"),
                    "log_line": part("server", "no_log_line"),
                    "answer": part("server", "endpoint"),
                },
                "per_run_cpu_us": cpu,
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
