"""SoWR's decision rules, as StableToolBench's eval_preference.py applies them (notes §5.4)."""

from __future__ import annotations

import pytest

from mirrorapi.evaluation.answers.items import AnswerItem
from mirrorapi.evaluation.judge.sowr import decide
from mirrorapi.prompts.judge_formats import SOWR_SYSTEM_V1, parse_preference, preference_messages


def item(status: str = "answer") -> AnswerItem:
    return AnswerItem("m", "G1_instruction", "1", "q", "a" if status == "answer" else "", status)


@pytest.mark.parametrize(
    "ref, cand, ref_verdict, cand_verdict, expected",
    [
        ("missing", "answer", None, "Unsolved", ("candidate", "missing answer")),  # upstream: output +1
        ("answer", "missing", "Solved", None, ("reference", "missing answer")),
        ("missing", "missing", None, None, (None, "both missing")),
        ("answer", "answer", "Solved", "Unsolved", ("reference", "pass rate")),  # exactly one Solved wins
        ("answer", "answer", "Unsure", "Solved", ("candidate", "pass rate")),
        ("answer", "answer", "Unsolved", "Unsure", ("candidate", "pass rate")),  # neither Solved: the Unsure one
        ("answer", "answer", "Solved", "Solved", (None, "compare")),  # both Solved: the judge compares
        ("answer", "give_up", "Unsolved", "Unsolved", (None, "compare")),
        ("empty", "give_up", "Unsolved", "Unsolved", (None, "no answers")),
        ("answer", "answer", None, "Solved", (None, "pending")),  # a failed SoPR call: no vote yet
    ],
)
def test_decide(ref, cand, ref_verdict, cand_verdict, expected):
    assert decide(item(ref), item(cand), ref_verdict, cand_verdict) == expected


def test_preference_prompt_and_parser():
    messages = preference_messages("Find X.", (("- f() -> 1", "X is 1"), ("", "")))
    assert "Answer A" in messages[1]["content"] and "(no final answer)" in messages[1]["content"]
    assert parse_preference("Preferred: B\nReason: it solves the query") == ("B", "it solves the query")
    assert parse_preference("**Preferred**: answer A") == ("A", "")
    assert parse_preference("Verdict: Solved") == (None, "")
    # The prompt's format line echoed back names both answers: no preference.
    format_line = next(line for line in SOWR_SYSTEM_V1.splitlines() if line.startswith("Preferred:"))
    assert parse_preference(format_line) == (None, "")
    assert parse_preference("Preferred: Answer A or Answer B")[0] is None
    assert parse_preference("Preferred: B, because A fails")[0] == "B"
