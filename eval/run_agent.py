"""Run an open tool-calling model on StableToolBench queries against /virtual (CoT@1 or DFS_woFilter_w2).

    python eval/run_agent.py --queries solvable_queries/test_instruction --server http://127.0.0.1:8080/virtual \
        --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --method CoT@1 \
        --out runs/answers/qwen7b_cot

No tool calls through the engine (e.g. SmolLM2)? `--prompt-format agent-react-v1` (text; llama.cpp: --react-grammar).

Writes raw answers `<out>/answer/<group>/<qid>_<method>.json` and converted `<out>/<group>.json`
(`eval/fac.py --answers <out>`). Reruns skip finished queries. Exit: 0 done, 1 queries failed, 2 bad input.
"""

import sys

from mirrorapi.command_line import run_script
from mirrorapi.evaluation.commands import RUN_AGENT


def main(argv: list[str] | None = None) -> int:
    return run_script(RUN_AGENT, argv, __doc__, "run_agent.py")


if __name__ == "__main__":
    sys.exit(main())
