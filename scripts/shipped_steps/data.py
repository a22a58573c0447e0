"""The data stage of `scripts/train_shipped_models.py`: the simulator and judge SFT sets, by the data builders."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from shipped_steps.common import REPO

# The data the shipped simulator is trained on (its recipe file says why each choice).
SIMULATOR_DATA_FLAGS = [
    "--prompt-format",
    "mirrorapi-v2",
    "--history",
    "8",
    "--stateless-too",
    "--few-shot",
    "1",
    "--repeat-sources",
    "tau-bench=3",
    "api-bank=2",
    "toolbench-example=4",
]
# The data the shipped judge is trained on: tau-bench's training answers four times, so that AnyToolBench's 810 labels
# do not drown its 152 (the judge's second run, docs/training.md).
JUDGE_DATA_FLAGS = ["--repeat-sources", "tau-bench/airline=4"]


def build_data(
    work: Path,
    pairs: list[str],
    tools: list[str],
    labelled: list[str],
    repeat_failures: int,
    target_chars: int,
    few_shot_ties: str,
    few_shot_char_budget: int,
    few_shot_response_chars: int,
    history_rule: str,
    without_examples_share: float,
    seed: int,
    split_rule: str,
    judge_test_fraction: float,
    judge_balance: str,
) -> dict:
    started = time.perf_counter()
    data = work / "data"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_simulator_sft.py"),
            "--pairs",
            *pairs,
            "--tools",
            *tools,
            *SIMULATOR_DATA_FLAGS,
            "--repeat-failures",
            str(repeat_failures),
            "--target-response-chars",
            str(target_chars),
            "--few-shot-ties",
            few_shot_ties,
            "--few-shot-char-budget",
            str(few_shot_char_budget),
            "--few-shot-response-chars",
            str(few_shot_response_chars),
            "--history-rule",
            history_rule,
            "--without-examples-share",
            str(without_examples_share),
            "--test-ood-shown",
            "--seed",
            str(seed),
            "--split-rule",
            split_rule,
            "--out",
            str(data / "simulator"),
        ],
        check=True,
    )
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_judge_sft.py"),
            "--labelled",
            *labelled,
            *JUDGE_DATA_FLAGS,
            "--seed",
            str(seed),
            "--split-rule",
            split_rule,
            "--test-fraction",
            str(judge_test_fraction),
            "--balance",
            judge_balance,
            "--out",
            str(data / "judge"),
        ],
        check=True,
    )
    return {"seconds": round(time.perf_counter() - started, 1)}
