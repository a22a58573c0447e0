"""Measure a virtual server's fidelity: replay real held-out calls and compare its answers with the real ones.

Usage:
    python eval/simulator.py --pairs heldout.jsonl --server http://127.0.0.1:8080 --out runs/fidelity \
        --baseline-pairs train.jsonl --tools ../shared/data/toolenv/realtools

Start the server with a fresh (empty) cache: a cache that already holds the held-out calls would be
measured instead of the simulator. Calls of an episode are sent in `step` order. Writes
`fidelity.md`, `fidelity.json`, `fidelity.png` and `calls.jsonl` into `--out`. Exit status: 0 done,
2 bad input or a server that does not answer.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mirrorapi.evaluation.fidelity import run_fidelity
from mirrorapi.evaluation.fidelity_metrics import FidelityError


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pairs", required=True, nargs="+", metavar="HELDOUT.jsonl",
                        help="Held-out real pairs (the pair schema of shared/data/pairs).")
    parser.add_argument("--server", required=True,
                        help="The virtual server, e.g. http://127.0.0.1:8080 (or .../virtual).")
    parser.add_argument("--out", required=True, help="Output folder (created).")
    parser.add_argument("--baseline-pairs", nargs="+", default=[], metavar="TRAIN.jsonl",
                        help="Training pairs for the nearest-example baseline.")
    parser.add_argument("--tools", nargs="+", default=[], metavar="FOLDER",
                        help="Tool docs (folders or files) for schema conformance.")
    parser.add_argument("--embedding-model", default=None, metavar="PATH",
                        help="A local transformers model folder for embedding cosine (optional).")
    parser.add_argument("--concurrency", type=int, default=8, help="Episodes replayed at once (default 8).")
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds per request (default 120).")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    if args.concurrency < 1 or args.timeout <= 0:
        print("error: --concurrency must be at least 1 and --timeout positive", file=sys.stderr)
        return 2
    if args.embedding_model and not Path(args.embedding_model).is_dir():
        print(f"error: embedding model folder not found: {args.embedding_model}", file=sys.stderr)
        return 2
    try:
        run_fidelity(args.pairs, args.server, args.out, baseline_pairs=args.baseline_pairs, tools=args.tools,
                     embedding_model=args.embedding_model, concurrency=args.concurrency, timeout=args.timeout,
                     progress=not args.no_progress)
    except FidelityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "fidelity.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
