"""A run killed while writing leaves a cut last line; the next run redoes that record and loses no other."""

from __future__ import annotations

import json

from harness.fake_engines import FixedReplyEngine
from mirrorapi.evaluation.benchmarks.apibank.scoring import _file_rows
from mirrorapi.evaluation.judge.scoring import JsonlStore
from mirrorapi.records import read_jsonl


def _cut_inside_a_character(record: dict) -> bytes:
    whole = json.dumps(record, ensure_ascii=False).encode("utf-8")
    first_wide = next(i for i, byte in enumerate(whole) if byte >= 0x80)
    return whole[: first_wide + 1]  # the first of the character's two bytes


def test_a_line_cut_inside_a_character_is_that_line_alone(tmp_path):
    path = tmp_path / "answers.jsonl"
    kept = {"query_id": 1, "answer": "café"}
    path.write_bytes(json.dumps(kept, ensure_ascii=False).encode() + b"\n" + _cut_inside_a_character(kept))
    bad: list[str] = []
    assert [value for _, value in read_jsonl(path, bad.append)] == [kept]
    assert bad == ["answers.jsonl:2: not UTF-8"]


def test_a_record_appended_after_a_cut_line_is_a_line_of_its_own(tmp_path):
    path = tmp_path / "answers.jsonl"
    first, cut, next_one = {"id": 1, "a": "é"}, {"id": 2, "a": "été"}, {"id": 3, "a": "x"}
    path.write_bytes(json.dumps(first, ensure_ascii=False).encode() + b"\n" + _cut_inside_a_character(cut))
    store = JsonlStore(path, lambda r: (r["id"],))
    assert set(store.load()) == {(1,)}  # the cut one is redone
    store.append(next_one)
    store.append({"id": 4, "a": "y"})
    assert set(store.load()) == {(1,), (3,), (4,)}  # a second kill now would lose nothing more


def test_apibank_rows_of_a_file_cut_inside_a_character(tmp_path):
    path = tmp_path / "samples.jsonl"
    row = {"level": 1, "dialogue": "d", "sample": 0, "kind": "response", "truth": "Très bien"}
    path.write_bytes(json.dumps(row, ensure_ascii=False).encode() + b"\n" + _cut_inside_a_character(row))
    assert _file_rows(path) == [row]


def _poison_tool_results(converted: dict) -> None:
    """Every tool call of every trajectory now returned an error; the final answers stay as they were."""
    for record in converted.values():
        node = record["answer"]["answer_details"][0]
        while node:
            if node["role"] == "tool" and node["message"]["name"] != "Finish":
                node["message"]["response"] = '{"error": "Unauthorized error...", "response": ""}'
            node = node["next"][0] if node["next"] else None


def test_a_rerun_judges_again_what_shows_the_judge_something_new(eval_cli, stb_answers, stb_ids, tmp_path):
    # FixedReplyEngine stands in for a judge: only which calls are sent matters here, not the verdicts.
    answers = tmp_path / "answers" / "model_a"
    answers.mkdir(parents=True)
    converted = json.loads((stb_answers / "virtual_chatgpt_dfs" / "G1_instruction.json").read_text())
    (answers / "G1_instruction.json").write_text(json.dumps(converted))

    def judge_calls(engine, metric: str) -> int:
        before = len(engine.requests)
        argv = ["--answers", str(answers), "--ids", str(stb_ids), "--model", "judge", "--base-url", engine.url]
        assert eval_cli("fac")([*argv, "--out", str(tmp_path / metric), "--metric", metric, "--no-progress"]) == 0
        return sum("Final answer:" in str(r["messages"]) for r in engine.requests[before:])

    with FixedReplyEngine("Verdict: Solved\nReason: fine") as judge:
        first = {metric: judge_calls(judge, metric) for metric in ("sopr", "fac")}
        assert first["sopr"] > 0 and first["fac"] == first["sopr"]
        assert judge_calls(judge, "sopr") == 0 and judge_calls(judge, "fac") == 0  # nothing changed
        _poison_tool_results(converted)
        (answers / "G1_instruction.json").write_text(json.dumps(converted))
        assert judge_calls(judge, "sopr") == first["sopr"]  # SoPR shows the tool calls: judged again
        assert judge_calls(judge, "fac") == 0  # FAC shows the final answer alone
