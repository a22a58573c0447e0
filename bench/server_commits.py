"""The virtual server at several commits, side by side in one run; prints one JSON line per measurement, then the
medians as one JSON object.

    .venv/bin/python bench/server_commits.py --tools ../shared/data/toolenv/toolenv2404 --rounds 4 \
        before=CHECKOUT_A after=CHECKOUT_B

Each side is a checkout of the repository (`git worktree add --detach DIR COMMIT`) whose
`serving/main_mirrorapi.py` is started with that checkout on PYTHONPATH, by this environment's Python. Every
round starts each side fresh, in alternating order, against the same cache (bench/server.py's: 2,000 APIs of the
tools folder, 10 recorded calls each) and the same stub engine (50 ms a call): 2,000 warm-up hits with 16 clients,
then 16,000 hits and 3,200 misses (calls no round made before) with 64 clients. Server CPU per request (its
process and children) is what to compare; a machine's drift shows in how the rounds' pairs move together.
"""

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # the harnesses; its siblings when imported by path

import server_load  # noqa: E402
import server_workloads  # noqa: E402

from harness.fake_engines import stub_engine_process  # noqa: E402
from harness.processes import checkout_env, free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("sides", nargs="+", metavar="NAME=CHECKOUT", help="A name and a checkout of the repository.")
    parser.add_argument("--tools", required=True, help="Tools folder the cache's APIs come from.")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    sides = dict(side.split("=", 1) for side in args.sides)
    for name, checkout in sides.items():
        if not (Path(checkout) / "serving" / "main_mirrorapi.py").is_file():
            parser.error(f"{name}: {checkout} is not a checkout of this repository")
    work = Path(tempfile.mkdtemp(prefix="server-commits-"))
    engine_port = free_port()
    engine = stub_engine_process(engine_port, server_workloads.ENGINE_LATENCY)
    cpu = {name: {"hits": [], "misses": []} for name in sides}
    print(json.dumps({"load_before": server_load.load_average(), "sides": sides}), flush=True)
    try:
        bodies = server_workloads.build_cache(args.tools, work / "base.sqlite")
        hits = work / "hits.json"
        hits.write_text(json.dumps([json.dumps(b) for b in random.Random(1).sample(bodies, len(bodies))]))
        for round_ in range(args.rounds):
            for name in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
                checkout = Path(sides[name]).resolve()
                misses = work / "misses.json"  # new arguments in every round and side: every call a miss
                misses.write_text(
                    json.dumps(
                        [
                            json.dumps(
                                {
                                    **b,
                                    "tool_input": json.dumps(
                                        {"r": round_, "s": name, "i": i, **json.loads(b["tool_input"])}
                                    ),
                                }
                            )
                            for i, b in enumerate(bodies[:3200])
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
                    script=checkout / "serving" / "main_mirrorapi.py",
                )
                live = f"http://127.0.0.1:{port}/live"
                env = checkout_env(checkout)
                with server_workloads.started(command, work, name, live, cwd=checkout, env=env) as (process, _):
                    server_load.run_load(port, process.pid, hits, 16, 2000)
                    hit = server_load.run_load(port, process.pid, hits, 64, 16000)
                    miss = server_load.run_load(port, process.pid, misses, 64, 3200)
                cpu[name]["hits"].append(hit["server_cpu_ms_per_request"])
                cpu[name]["misses"].append(miss["server_cpu_ms_per_request"])
                line = {"round": round_, "side": name, "hit_cpu_ms": round(hit["server_cpu_ms_per_request"], 4)}
                line.update(miss_cpu_ms=round(miss["server_cpu_ms_per_request"], 4), load=server_load.load_average())
                print(json.dumps(line), flush=True)
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: {kind: round(statistics.median(v), 4) for kind, v in c.items()} for name, c in cpu.items()}
    print(json.dumps({"medians_cpu_ms_per_request": medians, "load_after": server_load.load_average()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
