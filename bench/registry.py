"""Registry benchmark: load time, resident memory and lookup cost for a tools folder.

    python bench/registry.py [--tools ../shared/data/toolenv/toolenv2404] [--runs 5]

Each run loads the folder twice, each time in a fresh process (so memory is the registry's own): cold
(no compiled index: every JSON file is read, then the index is written, `mirrorapi/tools_index.py`, in a
temporary MIRRORAPI_TOOLS_INDEX_DIR) and warm (the index of the cold load). The tool files stay in the OS page cache
throughout (dropping it would slow every other job on the machine), so cold is the parsing, not the disk. Prints one
JSON object with medians and the load average. Targets: cold <= 3 s and <= 300 MB (issue 2), warm <= 1 s
(issue 21 §2; StableToolBench's server starts in 1.0 s here).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE_RUN = r"""
import json, resource, sys, time
from mirrorapi.names import api_key_name
from mirrorapi.tools import ToolRegistry
start = time.perf_counter()
registry = ToolRegistry.load([sys.argv[1]])
load = time.perf_counter() - start
docs = list(registry)
calls = [(d.category, d.tool, d.api) for d in docs]
start = time.perf_counter()
for category, tool, api in calls:
    registry.resolve(category, tool, api)
lookup = (time.perf_counter() - start) / len(calls)
stats = registry.stats()
print(json.dumps({"load_seconds": load, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "lookup_us": lookup * 1e6, "tools": stats["tools"], "apis": stats["apis"],
                  "categories": stats["categories"], "unreadable": stats["unreadable"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tools", default=str(REPO.parent / "shared/data/toolenv/toolenv2404"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not Path(args.tools).is_dir():
        sys.exit(f"bench/registry.py: tools folder not found: {args.tools}")
    sys.path.insert(0, str(REPO))
    from harness.processes import checkout_env

    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = {"cold": [], "warm": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as index_dir:  # empty at each cold load
            env = checkout_env(env=dict(os.environ, MIRRORAPI_TOOLS_INDEX_DIR=index_dir))
            for kind in ("cold", "warm"):
                out = subprocess.run(
                    [sys.executable, "-c", ONE_RUN, args.tools], capture_output=True, text=True, check=True, env=env
                )
                runs[kind].append(json.loads(out.stdout))
    result = {k: runs["cold"][0][k] for k in ("categories", "tools", "apis", "unreadable")}
    for kind in ("cold", "warm"):
        for key in ("load_seconds", "max_rss_mb", "lookup_us"):
            values = [r[key] for r in runs[kind]]
            result[f"{kind}_{key}_median"] = round(statistics.median(values), 3)
            result[f"{kind}_{key}_max"] = round(max(values), 3)
    result["runs"] = args.runs
    result["load_average"] = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    result["targets"] = {"cold_load_seconds": 3.0, "max_rss_mb": 300, "warm_load_seconds": 1.0}
    result["meets_targets"] = (
        result["cold_load_seconds_median"] <= 3.0
        and result["warm_load_seconds_median"] <= 1.0
        and max(result["cold_max_rss_mb_max"], result["warm_max_rss_mb_max"]) <= 300
    )
    from mirrorapi.versions import package_versions

    result["versions"] = package_versions()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
