"""ToolEyes' capability scores (s_FA, s_IC, s_BP, s_TS, s_AO) of agent trajectories, per scenario.

    python eval/tooleyes.py --answers runs/answers/qwen_cot --out runs/tooleyes \
        --base-url http://127.0.0.1:12346/v1 --model judge

--answers: converted answers (<model>/<group>.json, eval/run_agent.py's --out). Without --base-url only the
rule-based parts (s_FA, tool reality) are scored. Formulas: mirrorapi/evaluation/benchmarks/tooleyes.py.
Exit: 0 done, 1 some judge calls failed (their trajectories unrated), 2 bad input.
"""

import sys

from mirrorapi.evaluation.commands import tooleyes_command


def main(argv: list[str] | None = None) -> int:
    return tooleyes_command(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
