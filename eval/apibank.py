"""API-Bank level-1 (Call) and level-2 (Retrieve+Call) API-call accuracy and response ROUGE-L, on the virtual server.

    python eval/apibank.py --write-pairs runs/apibank/recorded-pairs.jsonl
    mirrorapi cache import runs/apibank/recorded-pairs.jsonl --cache mirrorapi_cache.sqlite
    (serve data/samples/tools/APIBank from that cache, then)
    python eval/apibank.py --server http://127.0.0.1:8080/virtual --base-url http://127.0.0.1:12345/v1 \
        --model agent --out runs/apibank

The dialogues are API-Bank's own (data/apibank, Apache-2.0); rules and differences:
mirrorapi/evaluation/benchmarks/apibank.py.
Writes <out>/report.md, summary.json and samples.jsonl. Exit: 0 done, 2 bad input or an unreachable server/engine.
"""
import sys

import httpx

from mirrorapi.evaluation.benchmarks import apibank


def main(argv=None) -> int:
    args = apibank.parser(__doc__).parse_args(argv)
    try:
        if args.write_pairs:
            dialogues = [d for level in args.levels for d in apibank.load_dialogues(args.data, level)]
            count = apibank.write_recorded_pairs(dialogues, apibank.tools_of(args.tools), args.write_pairs)
            print(f"{count} recorded calls -> {args.write_pairs}")
            return 0
        settings = apibank.settings_from(args)
        rows = apibank.evaluate(settings)
    except (ValueError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apibank.write_report(rows, settings, args.out)
    print((args.out / "report.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
