"""Run an open tool-calling model on StableToolBench queries against /virtual (CoT@1 or DFS_woFilter_w2).

    python eval/run_agent.py --queries solvable_queries/test_instruction --server http://127.0.0.1:8080/virtual \
        --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --method CoT@1 --out runs/answers/qwen7b_cot

No tool calls through the engine (e.g. SmolLM2)? `--prompt-format agent-react-v1` (text; llama.cpp: --react-grammar).

Writes raw answers `<out>/answer/<group>/<qid>_<method>.json` and converted `<out>/<group>.json`
(`eval/fac.py --answers <out>`). Reruns skip finished queries. Exit: 0 done, 1 queries failed, 2 bad input.
"""
import argparse
import sys

from mirrorapi.evaluation.agent.run import run_agent
from mirrorapi.evaluation.agent.settings import AgentRunError
from mirrorapi.evaluation.cli_args import add_agent_arguments, agent_settings_from


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_agent_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run = run_agent(args.queries, agent_settings_from(args), args.out, tools=args.tools,
                        progress=not args.no_progress, limit=args.limit)
    except (AgentRunError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{run.done} queries answered, {run.skipped} done before, {len(run.failures)} failed "
          f"({run.seconds:.1f} s); converted: {', '.join(str(p) for p in run.converted.values()) or 'none'}")
    if run.failures:
        print(f"incomplete: {len(run.failures)} queries failed (listed above); rerun the same command to retry them",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
