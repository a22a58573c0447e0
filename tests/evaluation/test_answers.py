"""Reading StableToolBench's converted answers and ids, answer extraction, verdicts, and the score arithmetic."""

import json

import pytest

from mirrorapi.evaluation.answers.items import (
    MISSING,
    AnswersError,
    build_items,
    extract_final_answer,
    load_answers,
    load_ids,
    render_steps,
)
from mirrorapi.evaluation.judge.scoring import ScoringRun
from mirrorapi.evaluation.score_tables import render_markdown, score_table
from mirrorapi.prompts.judge_formats import EMPTY, GIVE_UP, JUDGE_VERDICTS, judge_messages, parse_verdict

STB_GROUP_SIZES = {
    "G1_instruction": 163,
    "G1_category": 153,
    "G1_tool": 158,
    "G2_category": 124,
    "G2_instruction": 106,
    "G3_instruction": 61,
}


def _converted(stb_answers, model):
    return json.loads((stb_answers / model / "G1_instruction.json").read_text())


def test_finish_arguments_give_the_inner_answer_text(stb_answers):
    cot, dfs = _converted(stb_answers, "virtual_chatgpt_cot"), _converted(stb_answers, "virtual_chatgpt_dfs")
    raw = cot["1073"]["answer"]["final_answer"]
    assert raw.startswith('{\n  "return_type": "give_answer"')  # the raw Finish arguments, as converted
    status, text = extract_final_answer(raw)
    assert status == "answer"
    assert text.startswith("For the search query 'birthday party ideas', some popular sites")
    assert text.endswith("plan a memorable birthday party for your friend.")
    assert "return_type" not in text
    # The DFS file writes the JSON without indentation: same extraction.
    status, text = extract_final_answer(dfs["1073"]["answer"]["final_answer"])
    assert (status, text[:38]) == ("answer", "Popular sites for the search query 'bi")
    # CoT on query 588 never called Finish: the converted answer is "".
    assert cot["588"]["answer"]["final_answer"] == ""
    assert extract_final_answer(cot["588"]["answer"]["final_answer"]) == (EMPTY, "")


@pytest.mark.parametrize(
    "final_answer, expected",
    [
        # The Finish arguments of a give-up, as ToolBench's agent writes them.
        ('{\n  "return_type": "give_up_and_restart"\n}', (GIVE_UP, "")),
        ('{"return_type": "give_answer", "final_answer": ""}', (EMPTY, "")),
        ('{"return_type": "give_answer", "final_answer": "   "}', (EMPTY, "")),
        (None, (EMPTY, "")),
        # Raw newlines inside the string (agents' JSON is often not strict) and a cut-off closing brace.
        (
            '{\n  "return_type": "give_answer",\n  "final_answer": "line one\nline two"\n}',
            ("answer", "line one\nline two"),
        ),
        (
            '{"return_type": "give_answer", "final_answer": "Messi played for Barcelona',
            ("answer", "Messi played for Barcelona"),
        ),
        # Another agent's plain-text answer is judged as it is.
        ("Paris is the capital of France.", ("answer", "Paris is the capital of France.")),
    ],
)
def test_extract_final_answer(final_answer, expected):
    assert extract_final_answer(final_answer) == expected


def test_render_steps_lists_the_tool_calls_of_a_real_trajectory(stb_answers):
    details = _converted(stb_answers, "virtual_chatgpt_cot")["1073"]["answer"]["answer_details"]
    lines = render_steps(details).splitlines()
    assert [line.split("(")[0] for line in lines] == [
        "- popularsitesforquery_for_keyword_analysis",
        "- querykeywords_for_keyword_analysis",
    ]
    assert "pinterest.com" in lines[0]
    assert all(len(line) < 450 for line in lines)  # responses cut to a budget


def test_render_steps_shows_the_tool_calls_of_stabletoolbench_s_older_files():
    # StableToolBench's toolbench/tooleval/results/default_evalset/gpt-3.5-turbo_CoT/G1_instruction.json stores a
    # tool node's message as the Python repr of its dict, cut at 100 characters (this one is copied from there).
    message = (
        "{'name': 'generate_qr_code_for_qr_code_generator_v14', 'arguments': '{\\n  \"url\": \"https://www.exampl"
    )
    assert len(message) == 100
    finish = {"role": "tool", "message": {"name": "Finish", "arguments": "{}", "response": ""}, "next": []}
    details = [{"role": "system", "message": "", "next": [{"role": "tool", "message": message, "next": [finish]}]}]
    assert render_steps(details).startswith("- {'name': 'generate_qr_code_for_qr_code_generator_v14'")


def test_load_ids_of_the_six_groups(stb_ids):
    ids = load_ids(stb_ids)
    if len(ids) == 1:  # the bundled sample holds G1_instruction's three example ids only
        assert ids == {"G1_instruction": ["588", "608", "1073"]}
    else:
        assert {g: len(v) for g, v in ids.items()} == STB_GROUP_SIZES


def test_load_ids_from_a_query_file(samples):
    ids = load_ids(samples / "stabletoolbench/solvable_queries_example/test_instruction/G1_instruction.json")
    assert sorted(ids["G1_instruction"]) == ["1073", "588", "608"]


def test_every_id_becomes_an_item_missing_ones_included(stb_answers, tmp_path):
    answers = load_answers(stb_answers)
    assert sorted(answers) == ["virtual_chatgpt_cot", "virtual_chatgpt_dfs"]
    ids = {"G1_instruction": ["588", "608", "1073", "999999"], "G2_category": ["1", "2"]}
    items = build_items(answers, ids)
    assert len(items) == 2 * 6
    by_key = {(i.model, i.group, i.query_id): i for i in items}
    assert by_key[("virtual_chatgpt_cot", "G1_instruction", "588")].status == EMPTY
    assert by_key[("virtual_chatgpt_cot", "G1_instruction", "999999")].status == MISSING
    assert by_key[("virtual_chatgpt_dfs", "G2_category", "1")].status == MISSING  # no file for the group
    judged = by_key[("virtual_chatgpt_dfs", "G1_instruction", "608")]
    assert judged.status == "answer" and judged.query.startswith("I'm a fan of the streamer 'gmhikaru'")
    # One file alone is one model named after its folder.
    single = load_answers(stb_answers / "virtual_chatgpt_dfs" / "G1_instruction.json")
    assert list(single) == ["virtual_chatgpt_dfs"] and list(single["virtual_chatgpt_dfs"]) == ["G1_instruction"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"588": {"query": "q"}}', "not a converted answer file"),
    ],
)
def test_unusable_answer_files_are_one_clear_error(tmp_path, content, message):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "G1_instruction.json").write_text(content)
    with pytest.raises(AnswersError, match=message):
        load_answers(tmp_path / "m")
    with pytest.raises(AnswersError, match="not found"):
        load_ids(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "text, allowed, verdict",
    [
        # What StableToolBench's FAC script records for an empty answer (notes §5.5).
        ("Answer Status: \nUnsolved\nReason: Parsing error", ("Solved", "Unsolved"), "Unsolved"),
        ("Verdict: Solved\nReason: It lists the clubs; nothing is left unsolved.", ("Solved", "Unsolved"), "Solved"),
        ("Verdict: Unsure\nReason: the tool results do not say", JUDGE_VERDICTS["sopr-v1"], "Unsure"),
        ("Verdict: Unsure\nReason: the tool results do not say", JUDGE_VERDICTS["fac-v1"], None),
        ("The answer is partially solved and partially unsolved.", ("Solved", "Unsolved"), None),
    ],
)
def test_verdict_comes_from_the_label_line(text, allowed, verdict):
    assert parse_verdict(text, allowed)[0] == verdict


def test_sopr_prompt_shows_the_tool_calls():
    messages = judge_messages("Find Messi's clubs", "Barcelona, PSG", "sopr-v1", steps="- search(...) -> Barcelona")
    assert "Unsure" in messages[0]["content"]
    assert "Tool calls:\n- search(...) -> Barcelona" in messages[1]["content"]
    assert judge_messages("q", "a", "fac-v1", steps="ignored") == judge_messages("q", "a")


def _record(model, group, qid, repeat, verdict, score, judged=True, parsed=True):
    return {
        "model": model,
        "group": group,
        "query_id": qid,
        "repeat": repeat,
        "verdict": verdict,
        "score": score,
        "judged": judged,
        "parsed": parsed,
        "prompt_format": "sopr-v1",
    }


def test_score_table_denominators_repeats_and_average():
    from mirrorapi.evaluation.answers.items import AnswerItem

    ids = {"G1_instruction": ["1", "2", "3", "4"], "G3_instruction": ["7", "8"]}
    items = [AnswerItem("m", "G1_instruction", q, "q", "a", "answer") for q in ("1", "2", "3")]
    items += [AnswerItem("m", "G1_instruction", "4", "", "", MISSING)]
    items += [AnswerItem("m", "G3_instruction", q, "q", "a", "answer") for q in ("7", "8")]
    records = [
        # repeat 0: G1 = Solved + Unsure + unparseable + missing = 1.5 / 4; G3 = Solved + Solved = 2 / 2
        _record("m", "G1_instruction", "1", 0, "Solved", 1.0),
        _record("m", "G1_instruction", "2", 0, "Unsure", 0.5),
        _record("m", "G1_instruction", "3", 0, "Unsolved", 0.0, parsed=False),
        _record("m", "G1_instruction", "4", 0, "Unsolved", 0.0, judged=False),
        _record("m", "G3_instruction", "7", 0, "Solved", 1.0),
        _record("m", "G3_instruction", "8", 0, "Solved", 1.0),
        # repeat 1: G1 = 1 / 4 (and one judgment pending); G3 = 1 / 2
        _record("m", "G1_instruction", "1", 1, "Solved", 1.0),
        _record("m", "G1_instruction", "4", 1, "Unsolved", 0.0, judged=False),
        _record("m", "G3_instruction", "7", 1, "Unsolved", 0.0),
        _record("m", "G3_instruction", "8", 1, "Solved", 1.0),
    ]
    run = ScoringRun(records, items, ids, failures=["x"], judge_calls=0)
    table = score_table(run, "sopr", 2, "judge", "sopr-v1")
    g1, g3 = table["rows"][0]["groups"]["G1_instruction"], table["rows"][0]["groups"]["G3_instruction"]
    assert g1["per_repeat"] == [37.5, 25.0] and g1["score"] == 31.25 and g1["std"] == 6.25
    assert g3["per_repeat"] == [100.0, 50.0]
    # Average: the mean of the group columns per repeat (68.75, 37.5), then over repeats.
    assert table["rows"][0]["average"] == {"score": 53.125, "std": 15.625}
    assert (g1["missing"], g1["unparseable"], g1["solved"], g1["unsure"], g1["pending"]) == (1, 1, 2, 1, 2)
    assert g1["missing_ids"] == ["4"] and not table["complete"] and table["pending"] == 2
    markdown = render_markdown(table)
    assert "| Method | I1 Inst | I3 Inst | Average |" in markdown
    assert "| m | 31.2±6.2 | 75.0±25.0 | 53.1±15.6 |" in markdown
    assert "**Incomplete:** 2 judgment(s)" in markdown


def test_a_rate_is_rounded_once_as_stabletoolbench_prints_it():
    """StableToolBench prints `f"{solve_rate:.1f}"` of the unrounded rate: 11 of 163 (6.748...) is 6.7; rounded to
    two digits first it would be 6.75, printed 6.8."""
    from mirrorapi.evaluation.answers.items import AnswerItem

    ids = {"G1_instruction": [str(q) for q in range(163)]}
    items = [AnswerItem("m", "G1_instruction", q, "q", "a", "answer") for q in ids["G1_instruction"]]
    records = [
        _record("m", "G1_instruction", q, 0, *(("Solved", 1.0) if int(q) < 11 else ("Unsolved", 0.0)))
        for q in ids["G1_instruction"]
    ]
    table = score_table(ScoringRun(records, items, ids, failures=[], judge_calls=0), "fac", 1, "judge", "fac-v1")
    assert "| m | 6.7 | 6.7 |" in render_markdown(table)
