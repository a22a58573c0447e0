"""The server on uvicorn's public API against the server as it runs, side by side in one run; one JSON object.

    python bench/uvicorn_paths.py [--runs 2] [--tools ../shared/data/toolenv/toolenv2404]

The question of issue 36 §1: what the server's own transport (mirrorapi/serving/transport.py: a receive deadline
and gathered writes around uvicorn's HTTP protocol) buys over what uvicorn's public options give. bench/server.py's
workloads (its cache of 20,000 entries, its load generator, its 50 ms stub engine): hits and misses with 64
closed-loop clients, on one fresh server per variant, the variants alternating within each run:
- ours: the server as `serving/main_mirrorapi.py` runs it (`uvicorn_options`: uvicorn's own protocol, httptools,
  inside the receive deadline, writing through the gathered writes);
- deadline_only: the same, each write sent at once (the gathered writes off): the deadline's share;
- public_httptools, public_h11: the same app on uvicorn's public options only (`http="httptools"` / `"h11"`): no
  receive deadline (a client that trickles a request holds its connection), one send per write;
- public_route: /virtual as a FastAPI route with typed dependencies (bench/virtual_route.py's app) on public
  httptools;
- ours_workers, public_workers (unless `--no-workers`): `--workers 2`, each way.
Server CPU per request (the server's processes' user+system time over the workload, /proc) and requests/s;
medians over `--runs`, and each variant's CPU over ours.
"""

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the library and the harnesses of this clone

import server_load  # noqa: E402
import server_workloads  # noqa: E402

VARIANTS = (
    "ours",
    "deadline_only",
    "public_httptools",
    "public_h11",
    "public_route",
    "ours_workers",
    "public_workers",
)


def serve_variant(variant: str, argv: list[str]) -> None:
    """Run the server of `argv` (its flags) the way `variant` says."""
    import uvicorn

    from mirrorapi.serving import app as server
    from mirrorapi.serving import transport
    from mirrorapi.serving.config import add_server_arguments, settings_from_args

    settings = settings_from_args(add_server_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv))
    server.configure_logging(settings)
    options = transport.uvicorn_options(settings)
    if variant == "deadline_only":

        def write_at_once(self, data: bytes) -> None:
            if data and not self._transport.is_closing():
                self._transport.write(data)

        transport.GatheredWrites.write = write_at_once
    if variant.startswith("public"):
        options["http"] = "h11" if variant == "public_h11" else "httptools"
    if variant.endswith("workers"):
        if variant == "public_workers":  # the options serve_workers gives uvicorn: httptools alone
            server.uvicorn_options = lambda _: options
        return server.serve(settings.model_copy(update={"workers": 2}))
    if variant == "public_route":
        from virtual_route import route_app

        return uvicorn.run(route_app(settings), **options)
    uvicorn.run(server.create_app(settings), **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8000, help="Hit requests per server.")
    parser.add_argument("--misses", type=int, default=3200, help="Miss requests per server.")
    parser.add_argument("--no-workers", action="store_true", help="Leave out the --workers 2 variants.")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.variant:
        return serve_variant(args.variant, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/uvicorn_paths.py: tools folder not found: {args.tools}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops the servers and the engine
    from harness.fake_engines import stub_engine_process
    from harness.processes import free_port
    from mirrorapi.versions import package_versions

    variants = [v for v in VARIANTS if not (args.no_workers and v.endswith("workers"))]
    work = Path(tempfile.mkdtemp(prefix="mirrorapi-bench-uvicorn-paths-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, server_workloads.ENGINE_LATENCY)
    load_before = server_load.load_average()
    runs: list[dict] = []
    try:
        bodies = server_workloads.build_cache(args.tools, work / "base.sqlite")
        hits = work / "hits.json"
        hits.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        for run_index in range(args.runs):
            figures = {}
            for variant in variants:
                misses = work / "misses.json"
                misses.write_text(
                    json.dumps(
                        [
                            json.dumps(
                                {
                                    **b,
                                    "tool_input": json.dumps(
                                        {
                                            "run": run_index,
                                            "variant": variant,
                                            "miss": i,
                                            **json.loads(b["tool_input"]),
                                        }
                                    ),
                                }
                            )
                            for i, b in enumerate(bodies[: args.misses])
                        ]
                    )
                )
                shutil.copy(work / "base.sqlite", work / "cache.sqlite")
                port = free_port()
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
                    figures[variant] = {
                        "hits_64": server_load.run_load(
                            port, process.pid, hits, server_workloads.CLIENTS, args.requests
                        ),
                        "misses_64": server_load.run_load(
                            port, process.pid, misses, server_workloads.CLIENTS, args.misses
                        ),
                    }
            runs.append(figures)
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    medians = server_load.median_of(runs)
    cpu = {
        v: {w: round(medians[v][w]["server_cpu_ms_per_request"], 4) for w in ("hits_64", "misses_64")}
        for v in variants
    }
    per_run_cpu_over_ours = [
        {
            v: {
                w: round(r[v][w]["server_cpu_ms_per_request"] / r["ours"][w]["server_cpu_ms_per_request"], 3)
                for w in r[v]
            }
            for v in variants
        }
        for r in runs
    ]
    print(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "load_average_before": load_before,
                "load_average_after": server_load.load_average(),
                "clients": server_workloads.CLIENTS,
                "runs": args.runs,
                "server_cpu_ms_per_request": cpu,
                "rps": {v: {w: round(medians[v][w]["rps"], 1) for w in ("hits_64", "misses_64")} for v in variants},
                "cpu_over_ours": server_load.median_of(per_run_cpu_over_ours),  # the median of each run's ratio
                "per_run_cpu_over_ours": per_run_cpu_over_ours,
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
