"""Build the judge's SFT dataset from labelled final answers (the schema of shared/data/judge).

Usage:
    python data/build_judge_sft.py --labelled ../shared/data/judge/labelled.jsonl --out runs/data/judge

Writes a `datasets` DatasetDict (splits `train`, balanced, and `test`) and `stats.json` to --out;
`accelerate launch training/sft.py --config training/configs/tiny_judge_cpu.yaml --dataset_path OUT`
trains on it.
"""

import argparse
import itertools
import json
import logging
import sys
import time

from mirrorapi.data.judge_sft import JUDGE_COLUMNS, TRAINABLE_JUDGE_FORMATS, build_judge_records, read_labelled
from mirrorapi.data.simulator_sft import write_sft_dataset
from mirrorapi.records import SourceError


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--labelled", nargs="+", required=True, help="Labelled answer JSONL files.")
    parser.add_argument("--out", required=True, help="Output folder (replaced when the build succeeds).")
    parser.add_argument("--prompt-format", default="fac-v1", choices=TRAINABLE_JUDGE_FORMATS)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="Share of queries held out (test).")
    parser.add_argument("--no-balance", action="store_true", help="Keep the training split's natural balance.")
    parser.add_argument("--seed", type=int, default=42)
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    bad: list[str] = []
    try:
        records = itertools.chain(*[read_labelled(path, bad.append) for path in args.labelled])
        splits, stats = build_judge_records(records, args.prompt_format, args.test_fraction,
                                            not args.no_balance, args.seed)
    except (SourceError, ValueError, OSError) as exc:
        print(f"build_judge_sft.py: error: {exc}", file=sys.stderr)
        return 2
    stats["dropped"]["unreadable"] = len(bad)
    stats["unreadable_examples"] = bad[:10]
    stats["inputs"] = {"labelled": args.labelled}
    write_sft_dataset(args.out, splits, stats, JUDGE_COLUMNS)
    print(json.dumps({"out": args.out, "read": stats["read"]["total"], "dropped": stats["dropped"],
                      "splits": {k: v["records"] for k, v in stats["splits"].items()},
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
