"""Build the simulator's SFT dataset from real request -> response pairs and tool docs.

Usage:
    python data/build_simulator_sft.py --pairs ../shared/data/pairs/*.jsonl \
        --tools ../shared/data/toolenv/realtools --out runs/data/simulator
    python data/build_simulator_sft.py --stabletoolbench-cache server/tool_response_cache \
        --tools server/tools --out runs/data/simulator-cache
    python data/build_simulator_sft.py --alpaca train_sft.json --out runs/data/simulator-alpaca

Writes a `datasets` DatasetDict (splits `train`, `test_id`, `test_ood`) and `stats.json` to --out;
`accelerate launch training/sft.py --dataset_path OUT` trains on it.
"""

import argparse
import itertools
import json
import logging
import sys
import time

from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
from mirrorapi.data.sources import read_alpaca
from mirrorapi.prompts import SIMULATOR_FORMATS
from mirrorapi.records import SourceError, read_pairs_jsonl, read_stabletoolbench_cache
from mirrorapi.tools import RegistryError, ToolRegistry


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pairs", nargs="+", default=[], help="Pair JSONL files (the schema of shared/data/pairs).")
    parser.add_argument("--stabletoolbench-cache", nargs="+", default=[], metavar="FOLDER",
                        help="StableToolBench cache folders (<cat>/<tool>_for_<cat>/<api>.json).")
    parser.add_argument("--alpaca", nargs="+", default=[], metavar="FILE",
                        help="MirrorAPI-style alpaca files (system/instruction/output; JSON list or JSONL).")
    parser.add_argument("--tools", nargs="+", default=[], metavar="SOURCE",
                        help="Tools folders / query files with the docs of the pairs' APIs.")
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--prompt-format", default="mirrorapi-v1", choices=SIMULATOR_FORMATS)
    parser.add_argument("--system-prompt-file", help="System prompt for the stabletoolbench formats.")
    parser.add_argument("--few-shot", type=int, default=0,
                        help="Real examples of the same API per prompt; match the server's `few_shot` setting.")
    parser.add_argument("--ood-fraction", type=float, default=0.05, help="Share of APIs held out (test_ood).")
    parser.add_argument("--id-fraction", type=float, default=0.05,
                        help="Share of the other episodes held out (test_id).")
    parser.add_argument("--seed", type=int, default=42)
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not (args.pairs or args.stabletoolbench_cache or args.alpaca):
        print("build_simulator_sft.py: error: give at least one of --pairs, --stabletoolbench-cache, --alpaca",
              file=sys.stderr)
        return 2
    if (args.pairs or args.stabletoolbench_cache) and not args.tools:
        print("build_simulator_sft.py: error: --pairs and --stabletoolbench-cache need --tools (the API docs)",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    bad: list[str] = []
    try:
        system_prompt = open(args.system_prompt_file, encoding="utf-8").read() if args.system_prompt_file else None
        options = SimulatorDataOptions(args.prompt_format, system_prompt, args.few_shot,
                                       ood_fraction=args.ood_fraction, id_fraction=args.id_fraction, seed=args.seed)
        options.check()
        registry = ToolRegistry.load(args.tools)
        sources = [read_pairs_jsonl(p, bad.append) for p in args.pairs]
        sources += [read_stabletoolbench_cache(f, bad.append) for f in args.stabletoolbench_cache]
        sources += [read_alpaca(f, bad.append) for f in args.alpaca]
        splits, stats = build_simulator_records(itertools.chain(*sources), registry, options, progress=True)
    except (SourceError, RegistryError, ValueError, OSError) as exc:
        print(f"build_simulator_sft.py: error: {exc}", file=sys.stderr)
        return 2
    stats["dropped"]["unreadable"] = len(bad)
    stats["unreadable_examples"] = bad[:10]
    stats["inputs"] = {"pairs": args.pairs, "stabletoolbench_cache": args.stabletoolbench_cache,
                       "alpaca": args.alpaca, "tools": args.tools}
    stats["build_seconds"] = round(time.perf_counter() - start, 2)
    write_sft_dataset(args.out, splits, stats)
    print(json.dumps({"out": args.out, "read": stats["read"]["total"], "dropped": stats["dropped"],
                      "kept": stats["kept"], "splits": {k: v["records"] for k, v in stats["splits"].items()},
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
