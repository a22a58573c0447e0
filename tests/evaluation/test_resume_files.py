"""A run killed while writing leaves a cut last line; the next run redoes that record and loses no other."""

from __future__ import annotations

import json

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
