"""SoWR's decision rules, as StableToolBench's eval_preference.py applies them (notes §5.4)."""

from __future__ import annotations

import json

import pytest

from mirrorapi.evaluation.answers.items import AnswerItem, build_items
from mirrorapi.evaluation.judge.sowr import decide
from mirrorapi.prompts.judge_formats import SOWR_SYSTEM_V1, parse_preference, preference_messages


def item(status: str = "answer", text: str = "a") -> AnswerItem:
    return AnswerItem("m", "G1_instruction", "1", "q", text if status == "answer" else "", status)


@pytest.mark.parametrize(
    "ref, cand, ref_verdict, cand_verdict, expected",
    [
        ("missing", "answer", None, "Unsolved", ("candidate", "missing answer")),  # upstream: output +1
        ("answer", "missing", "Solved", None, ("reference", "missing answer")),
        ("missing", "missing", None, None, ("candidate", "missing answer")),  # upstream checks the reference first
        ("answer", "answer", "Solved", "Unsolved", ("reference", "pass rate")),  # exactly one Solved wins
        ("answer", "answer", "Unsure", "Solved", ("candidate", "pass rate")),
        ("answer", "answer", "Unsolved", "Unsure", ("candidate", "pass rate")),  # neither Solved: the Unsure one
        ("answer", "answer", "Solved", "Solved", (None, "compare")),  # both Solved: the judge compares
        ("answer", "give_up", "Unsolved", "Unsolved", (None, "compare")),
        ("empty", "give_up", "Unsolved", "Unsolved", (None, "compare")),  # upstream's judge compares them too
        ("empty", "empty", "Unsolved", "Unsolved", (None, "identical")),  # alike: upstream's random pick
        ("answer", "answer", None, "Solved", (None, "pending")),  # a failed SoPR call: no vote yet
    ],
)
def test_decide(ref, cand, ref_verdict, cand_verdict, expected):
    assert decide(item(ref), item(cand, text="b"), ref_verdict, cand_verdict) == expected


def test_alike_answers_are_a_coin_not_a_call():
    assert decide(item(), item(), "Solved", "Solved") == (None, "identical")
    other_steps = AnswerItem("m", "G1_instruction", "1", "q", "a", "answer", steps="- f() -> 1")
    assert decide(item(), other_steps, "Solved", "Solved") == (None, "compare")


def test_two_answers_without_a_final_answer_after_other_calls_are_compared(stb_answers, tmp_path):
    """StableToolBench's data_example: CoT's query 588 ended without a final answer; DFS's, its final answer taken
    away, is another trajectory without one. Upstream's check_identity_answers (rtl.py) calls answers alike only when
    their final answers and their answer_details are, so its judge compares these two; the same trajectory twice
    is its random pick."""
    files = {}
    for model in ("virtual_chatgpt_cot", "virtual_chatgpt_dfs"):
        records = json.loads((stb_answers / model / "G1_instruction.json").read_text())
        files[model] = {"G1_instruction": {"588": records["588"]}}
    assert files["virtual_chatgpt_cot"]["G1_instruction"]["588"]["answer"]["final_answer"] == ""
    dfs = files["virtual_chatgpt_dfs"]["G1_instruction"]["588"]
    dfs["answer"] = {**dfs["answer"], "final_answer": ""}
    ids = {"G1_instruction": ["588"]}
    cot, dfs_item = build_items(files, ids)
    assert cot.status == dfs_item.status == "empty" and cot.steps != dfs_item.steps
    assert decide(cot, dfs_item, "Unsolved", "Unsolved") == (None, "compare")
    assert "transfermarkt" in cot.steps  # what the preference judge is shown of each
    twin = build_items({"twin": files["virtual_chatgpt_cot"]}, ids)[0]
    assert decide(cot, twin, "Unsolved", "Unsolved") == (None, "identical")


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


def test_alike_answers_take_no_call_and_other_candidates_verdicts_stay(faulty_judge, samples, tmp_path):
    """StableToolBench's select_better_answer picks at random between answers with the same final answer and
    details, without asking its judge; and a preference judged once is not judged again when another candidate
    was compared into the same folder in between (preferences.jsonl once kept only the last run's)."""
    import shutil

    from mirrorapi.evaluation.judge.scoring import JudgeSettings
    from mirrorapi.evaluation.judge.sowr import run_sowr

    converted = samples / "stabletoolbench" / "data_example" / "model_predictions_converted"
    ids = samples / "stabletoolbench" / "solvable_queries_example" / "test_query_ids"
    copy = tmp_path / "answers" / "cot_copy"
    shutil.copytree(converted / "virtual_chatgpt_cot", copy)
    faulty_judge.reply = "Preferred: A\nReason: it is shorter"  # no SoPR verdict: every answer Unsolved
    judge = JudgeSettings(base_urls=[faulty_judge.base_url], model=faulty_judge.model, concurrency=1)
    reference, other = converted / "virtual_chatgpt_cot", converted / "virtual_chatgpt_dfs"

    first = run_sowr(reference, [other], ids, judge, tmp_path / "out", rounds=2, progress=False)
    assert first.preference_calls > 0 and not first.failures
    alike = run_sowr(reference, [copy], ids, judge, tmp_path / "out", rounds=2, progress=False)
    assert alike.preference_calls == 0
    cells = json.loads((tmp_path / "out" / "sowr.json").read_text())["rows"][0]["groups"]["G1_instruction"]
    assert cells["ids"] == 3 and cells["pending"] == 0  # every round went to a side: each query decided
    again = run_sowr(reference, [other], ids, judge, tmp_path / "out", rounds=2, progress=False)
    assert again.preference_calls == 0
