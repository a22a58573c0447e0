"""Simulator SFT builder benchmark: 100,000 pairs over the ~47k ToolEnv2404 APIs, end to end.

    python bench/sft_data.py [--pairs 100000] [--runs 3] [--tools ../shared/data/toolenv/toolenv2404]

No real data set has 100k pairs over 47k APIs, so the workload is made from real parts: every API of
ToolEnv2404 gets calls whose arguments are its documented parameters (a value per call), and whose
observations are the real observations of ../shared/data/pairs taken in turn (successes, API
errors, transport failures, long responses), in episodes of 1-4 calls; 5% of the calls repeat an
earlier one (the duplicate rule). Each run is the real command
`data/build_simulator_sft.py --pairs ... --tools ... --out ...` in a fresh process, timed from start
to exit (tool loading, rules, rendering, splitting, writing). Prints one JSON object with the median.
Target (issue 4): <= 60 s on the project's 2-core machine.
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_load import load_average

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TARGET_SECONDS = 60


def make_workload(tools: Path, pairs_dir: Path, n_pairs: int, out: Path, seed: int = 0) -> dict:
    sys.path.insert(0, str(REPO))
    from mirrorapi.tools import ToolRegistry

    docs = list(ToolRegistry.load([tools]))
    observations = [json.loads(line)["response"] for f in sorted(pairs_dir.glob("*.jsonl")) for line in open(f)]
    rng = random.Random(seed)
    written, episode, step, previous = 0, 0, 0, []
    with open(out, "w", encoding="utf-8") as fh:
        while written < n_pairs:
            doc = docs[written % len(docs)]
            if previous and rng.random() < 0.05:
                fh.write(rng.choice(previous))
            else:
                # Documented parameters with a value per call (APIs without parameters repeat `{}`).
                arguments = {p["name"]: f"v{written}" for p in doc.required_parameters}
                if doc.optional_parameters and (not arguments or rng.random() < 0.5):
                    p = doc.optional_parameters[0]
                    arguments[p["name"]] = p.get("default") or written
                line = (
                    json.dumps(
                        {
                            "source": "bench",
                            "episode": f"e{episode}",
                            "step": step,
                            "category": doc.category,
                            "tool_name": doc.tool,
                            "api_name": doc.api,
                            "tool_input": arguments,
                            "response": observations[written % len(observations)],
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
                fh.write(line)
                previous = previous[-999:] + [line]
            written += 1
            step += 1
            if step >= rng.randint(1, 4):
                episode, step = episode + 1, 0
    return {"pairs": written, "apis": len(docs), "episodes": episode + 1, "bytes": out.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", type=Path, default=SHARED / "toolenv/toolenv2404")
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not args.tools.is_dir() or not (SHARED / "pairs").is_dir():
        sys.exit(f"bench/sft_data.py: needs {args.tools} and {SHARED / 'pairs'} (the shared data package)")
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        workload = make_workload(args.tools, SHARED / "pairs", args.pairs, Path(tmp) / "pairs.jsonl")
        from harness.processes import checkout_env  # make_workload put this checkout on sys.path

        load_before = load_average()
        seconds, summary = [], {}
        for run in range(args.runs):
            start = time.perf_counter()
            result = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "data/build_simulator_sft.py"),
                    "--pairs",
                    str(Path(tmp) / "pairs.jsonl"),
                    "--tools",
                    str(args.tools),
                    "--out",
                    str(Path(tmp) / f"out{run}"),
                ],
                capture_output=True,
                text=True,
                check=True,
                env=checkout_env(),
            )
            seconds.append(time.perf_counter() - start)
            summary = json.loads(result.stdout.strip().splitlines()[-1])
        size = sum(f.stat().st_size for f in (Path(tmp) / "out0").rglob("*") if f.is_file())
    median = statistics.median(seconds)
    from mirrorapi.versions import package_versions  # make_workload put this checkout on sys.path

    print(
        json.dumps(
            {
                "benchmark": "sft_data",
                "workload": workload,
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "runs_seconds": [round(s, 1) for s in seconds],
                "median_seconds": round(median, 1),
                "pairs_per_second": round(workload["pairs"] / median),
                "target_seconds": TARGET_SECONDS,
                "meets_target": median <= TARGET_SECONDS,
                "dataset_mb": round(size / 2**20, 1),
                "dropped": summary.get("dropped"),
                "kept": summary.get("kept"),
                "splits": summary.get("splits"),
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
