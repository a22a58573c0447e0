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

from mirrorapi.evaluation.commands import apibank_command


def main(argv: list[str] | None = None) -> int:
    return apibank_command(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
