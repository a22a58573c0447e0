"""Registry benchmark: load time, resident memory and lookup cost for a tools folder.

    python bench/registry.py [--tools ../shared/data/toolenv/toolenv2404] [--runs 5]

Each run loads the folder in a fresh process (so memory is the registry's own); prints one JSON
object with medians. Target (issue #2): the 12,300-tool ToolEnv2404 in <= 3 s and <= 300 MB.
"""

import argparse
import json
import statistics
import subprocess
import sys
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
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", ONE_RUN, args.tools], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    result = {k: runs[0][k] for k in ("categories", "tools", "apis", "unreadable")}
    for key in ("load_seconds", "max_rss_mb", "lookup_us"):
        values = [r[key] for r in runs]
        result[key + "_median"] = round(statistics.median(values), 3)
        result[key + "_max"] = round(max(values), 3)
    result["runs"] = args.runs
    result["targets"] = {"load_seconds": 3.0, "max_rss_mb": 300}
    result["meets_targets"] = result["load_seconds_median"] <= 3.0 and result["max_rss_mb_max"] <= 300
    sys.path.insert(0, str(REPO))
    from mirrorapi.versions import package_versions

    result["versions"] = package_versions()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
