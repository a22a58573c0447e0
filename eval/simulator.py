"""Measure a virtual server's fidelity: replay real held-out calls and compare its answers with the real ones.

Usage:
    python eval/simulator.py --pairs heldout.jsonl --server http://127.0.0.1:8080 --out runs/fidelity \
        --baseline-pairs train.jsonl --tools ../shared/data/toolenv/realtools

Start the server with a fresh (empty) cache: a cache that already holds the held-out calls would be
measured instead of the simulator. Calls of an episode are sent in `step` order. Writes
`fidelity.md`, `fidelity.json`, `fidelity.png` and `calls.jsonl` (one row per call) into `--out`; with
`--history both`, `calls.jsonl` is the call-by-call pass and `session_calls.jsonl` the same calls in sessions.
Exit status: 0 done, 2 bad input or a server that does not answer.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.evaluation.commands import FIDELITY


def main(argv: list[str] | None = None) -> int:
    return run_script(FIDELITY, argv, __doc__, "simulator.py")


if __name__ == "__main__":
    sys.exit(main())
