"""`python eval/fac.py` end to end: the tiny model behind `transformers serve` judges real StableToolBench answers.

The tiny model is untrained, so its verdicts are arbitrary: these tests check records, counts,
denominators, parsing and resumption, never scores.
"""

import asyncio
import csv
import json
import shutil

import pytest

from mirrorapi.engine_client import EngineClient, engine_concurrency
from mirrorapi.evaluation.answers.items import build_items, load_answers, load_ids
from mirrorapi.evaluation.judge.scoring import JudgeSettings, run_scoring
from mirrorapi.prompts.judge_formats import parse_verdict

RECORD_KEYS = {
    "metric",
    "model",
    "group",
    "query_id",
    "repeat",
    "verdict",
    "score",
    "reason",
    "judged",
    "parsed",
    "status",
    "answer",
    "raw",
    "prompt_format",
    "judge",
    "shown",
}
# In StableToolBench's data_example (G1_instruction 588, 608, 1073), CoT never finished query 588:
# five answers have text to judge.
JUDGED_EXAMPLE_ANSWERS = 5


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _example_ids(samples):
    return samples / "stabletoolbench" / "solvable_queries_example" / "test_query_ids"


def _copied_answers(stb_answers, samples, judge, tmp_path, out: str, *flags: str) -> tuple:
    """A copy of the example answers to change, and the `eval/fac.py` arguments judging it into `tmp_path/out`."""
    answers = tmp_path / "answers"
    shutil.copytree(stb_answers, answers)
    argv = ["--answers", str(answers), "--ids", str(_example_ids(samples)), "--base-url", judge.base_url]
    return answers, [*argv, "--model", judge.model, "--out", str(tmp_path / out), *flags, "--no-progress"]


@pytest.mark.slow
def test_fac_scores_every_id_and_resumes(eval_cli, tiny_engine, stb_answers, stb_ids, tmp_path):
    out = tmp_path / "fac"
    argv = [
        "--answers",
        str(stb_answers),
        "--ids",
        str(stb_ids),
        "--base-url",
        tiny_engine.base_url,
        "--model",
        tiny_engine.model,
        "--out",
        str(out),
        "--max-tokens",
        "8",
        "--concurrency",
        "4",
        "--no-progress",
    ]
    assert eval_cli("fac")(argv) == 0

    ids = load_ids(stb_ids)
    items = build_items(load_answers(stb_answers), ids)
    records = _lines(out / "answers.jsonl")
    assert len(records) == 2 * sum(len(v) for v in ids.values())  # every id of every group, for both models
    assert all(set(r) == RECORD_KEYS for r in records)
    assert {(r["model"], r["group"], r["query_id"]) for r in records} == {
        (i.model, i.group, i.query_id) for i in items
    }
    judged = [r for r in records if r["judged"]]
    assert len(judged) == JUDGED_EXAMPLE_ANSWERS
    for r in records:
        assert r["prompt_format"] == "fac-v1" and r["judge"] == tiny_engine.model
        if r["judged"]:
            verdict = parse_verdict(r["raw"])[0]
            assert r["parsed"] == (verdict is not None)
            assert r["verdict"] == (verdict or "Unsolved")
            assert not r["answer"].startswith("{")  # the inner Finish text was judged, not the JSON
        else:
            assert (r["verdict"], r["raw"], r["status"] in ("missing", "empty", "give_up")) == ("Unsolved", "", True)
        assert r["score"] == (1.0 if r["verdict"] == "Solved" else 0.0)

    table = json.loads((out / "fac.json").read_text())
    assert [row["model"] for row in table["rows"]] == ["virtual_chatgpt_cot", "virtual_chatgpt_dfs"]
    assert sorted(table["groups"]) == sorted(ids) and table["complete"]
    if len(ids) == 6:  # StableToolBench's column order
        assert table["groups"] == [
            "G1_instruction",
            "G1_category",
            "G1_tool",
            "G2_category",
            "G2_instruction",
            "G3_instruction",
        ]
    for row in table["rows"]:
        for group, cell in row["groups"].items():
            assert cell["ids"] == len(ids[group])
            accounted = (
                cell["missing"]
                + cell["empty"]
                + cell["give_up"]
                + cell["solved"]
                + cell["unsure"]
                + cell["unsolved"]
                + cell["unparseable"]
                + cell["pending"]
            )
            assert accounted == cell["ids"]
            solved = sum(r["score"] for r in records if (r["model"], r["group"]) == (row["model"], group))
            assert cell["score"] == 100 * solved / len(ids[group])
    with open(out / "fac.csv") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][: len(ids) + 2] == ["method", *table["groups"], "average"] and len(rows) == 3
    markdown = (out / "fac.md").read_text()
    if len(ids) == 6:
        assert "| Method | I1 Inst | I1 Cat | I1 Tool | I2 Cat | I2 Inst | I3 Inst | Average |" in markdown
        assert "- virtual_chatgpt_cot / G1_category: all 153 ids (no answers for this group)" in markdown

    # A rerun judges nothing again and leaves the file as it was.
    before = (out / "answers.jsonl").read_text()
    settings = JudgeSettings([tiny_engine.base_url], tiny_engine.model, max_tokens=8, concurrency=4)
    rerun = run_scoring(stb_answers, stb_ids, settings, out, progress=False)
    assert rerun.judge_calls == 0 and (out / "answers.jsonl").read_text() == before

    # An interrupted run: one judged record lost and a torn last line. Only that one is judged again.
    lost = judged[0]
    kept = [line for line in before.splitlines() if json.loads(line) != lost]
    (out / "answers.jsonl").write_text("\n".join(kept) + '\n{"metric": "fac", "model": "virtual_chat')
    resumed = run_scoring(stb_answers, stb_ids, settings, out, progress=False)
    assert resumed.judge_calls == 1
    after = _lines(out / "answers.jsonl")
    assert len(after) == len(records)
    assert [r for r in after if r["judged"] and r["query_id"] == lost["query_id"] and r["model"] == lost["model"]]


@pytest.mark.slow
def test_repeats_and_sopr_share_an_output_folder(tiny_engine, stb_answers, samples, tmp_path, caplog):
    settings = JudgeSettings([tiny_engine.base_url], tiny_engine.model, max_tokens=8, concurrency=4)
    ids = _example_ids(samples)
    sopr = run_scoring(stb_answers, ids, settings, tmp_path, metric="sopr", repeats=2, progress=False)
    # repeats of a greedy judge measure nothing (StableToolBench samples its judges at 0.2): said once
    assert sum("2 repeats at temperature 0" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    fac = run_scoring(stb_answers, ids, settings, tmp_path, metric="fac", progress=False)
    assert not any("temperature 0" in r.getMessage() for r in caplog.records)
    assert sopr.judge_calls == 2 * JUDGED_EXAMPLE_ANSWERS and fac.judge_calls == JUDGED_EXAMPLE_ANSWERS
    records = _lines(tmp_path / "answers.jsonl")
    assert len(records) == 2 * 3 * 2 + 2 * 3  # models x ids x repeats (SoPR), then FAC once
    sopr_records = [r for r in records if r["metric"] == "sopr"]
    assert {r["repeat"] for r in sopr_records} == {0, 1}
    assert {r["prompt_format"] for r in sopr_records} == {"sopr-v1"}
    assert all(r["score"] == {"Solved": 1.0, "Unsure": 0.5, "Unsolved": 0.0}[r["verdict"]] for r in sopr_records)
    table = json.loads((tmp_path / "sopr.json").read_text())
    assert table["repeats"] == 2 and all(
        len(c["per_repeat"]) == 2 for row in table["rows"] for c in row["groups"].values()
    )
    assert (tmp_path / "fac.md").is_file() and "SoPR" in (tmp_path / "sopr.md").read_text()


def test_unparseable_judge_outputs_count_unsolved_and_are_reported(
    eval_cli, faulty_judge, stb_answers, samples, tmp_path
):
    argv = [
        "--answers",
        str(stb_answers),
        "--ids",
        str(_example_ids(samples)),
        "--base-url",
        faulty_judge.base_url,
        "--model",
        faulty_judge.model,
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    assert eval_cli("fac")(argv) == 0
    judged = [r for r in _lines(tmp_path / "answers.jsonl") if r["judged"]]
    assert len(judged) == JUDGED_EXAMPLE_ANSWERS == faulty_judge.requests
    assert all(
        (r["verdict"], r["score"], r["parsed"], r["raw"]) == ("Unsolved", 0.0, False, faulty_judge.reply)
        for r in judged
    )
    cells = [c for row in json.loads((tmp_path / "fac.json").read_text())["rows"] for c in row["groups"].values()]
    assert sum(c["unparseable"] for c in cells) == JUDGED_EXAMPLE_ANSWERS
    assert sum(c["solved"] + c["unsolved"] for c in cells) == 0


def test_failed_judge_calls_stay_pending_until_a_rerun(eval_cli, faulty_judge, stb_answers, samples, tmp_path, capsys):
    faulty_judge.failing, faulty_judge.fail_on = True, "gmhikaru"  # query 608, answered by both models
    argv = [
        "--answers",
        str(stb_answers),
        "--ids",
        str(_example_ids(samples)),
        "--base-url",
        faulty_judge.base_url,
        "--model",
        faulty_judge.model,
        "--out",
        str(tmp_path),
        "--timeout",
        "5",
        "--no-progress",
    ]
    assert eval_cli("fac")(argv) == 1
    assert "2 judge call(s) failed" in capsys.readouterr().err
    table = json.loads((tmp_path / "fac.json").read_text())
    assert (table["complete"], table["pending"]) == (False, 2)
    assert not [r for r in _lines(tmp_path / "answers.jsonl") if r["query_id"] == "608" and r["judged"]]
    assert "**Incomplete:** 2 judgment(s) failed" in (tmp_path / "fac.md").read_text()

    faulty_judge.failing = False
    sent = faulty_judge.requests
    assert eval_cli("fac")(argv) == 0
    assert faulty_judge.requests == sent + 2
    assert json.loads((tmp_path / "fac.json").read_text())["complete"]


def test_a_changed_answer_whose_judge_call_fails_is_pending_not_its_old_verdict(
    eval_cli, faulty_judge, stb_answers, samples, tmp_path, capsys
):
    """An answer judged once, then changed (a rerun of the agent): its earlier verdict is another answer's, so while
    the new one's judge call fails it is pending (the module's "failed calls are not recorded"), never scored with
    the old verdict in a table that says it is complete."""
    faulty_judge.reply = "Verdict: Solved"
    answers, argv = _copied_answers(stb_answers, samples, faulty_judge, tmp_path, "fac", "--timeout", "5")
    assert eval_cli("fac")(argv) == 0
    dfs_file = answers / "virtual_chatgpt_dfs" / "G1_instruction.json"
    records = json.loads(dfs_file.read_text())
    assert records["588"]["answer"]["final_answer"]
    records["588"]["answer"]["final_answer"] = "I could not find Lionel Messi's career statistics."
    dfs_file.write_text(json.dumps(records))
    faulty_judge.failing, faulty_judge.fail_on = True, "could not find Lionel Messi"
    assert eval_cli("fac")(argv) == 1
    assert "1 judge call(s) failed" in capsys.readouterr().err
    table = json.loads((tmp_path / "fac" / "fac.json").read_text())
    assert (table["complete"], table["pending"]) == (False, 1)
    dfs_row = next(row for row in table["rows"] if row["model"] == "virtual_chatgpt_dfs")
    assert dfs_row["groups"]["G1_instruction"]["pending"] == 1 and dfs_row["groups"]["G1_instruction"]["solved"] == 2

    faulty_judge.failing = False
    assert eval_cli("fac")(argv) == 0
    assert json.loads((tmp_path / "fac" / "fac.json").read_text())["complete"]


def test_user_mistakes_are_one_line_and_exit_2(eval_cli, faulty_judge, stb_answers, samples, tmp_path, capsys):
    from harness.processes import free_port

    fac = eval_cli("fac")
    ids = str(_example_ids(samples))
    common = ["--answers", str(stb_answers), "--ids", ids, "--out", str(tmp_path / "o"), "--no-progress"]
    down = f"http://127.0.0.1:{free_port()}/v1"
    cases = [
        (common + ["--base-url", down, "--model", "m"], "not reachable"),
        (
            [
                "--answers",
                str(tmp_path / "none"),
                "--ids",
                ids,
                "--base-url",
                down,
                "--model",
                "m",
                "--out",
                str(tmp_path / "o"),
            ],
            "answers not found",
        ),
        (common + ["--base-url", faulty_judge.base_url, "--model", "m", "--repeats", "0"], "at least 1"),
    ]
    empty = tmp_path / "ids"  # a group file without ids (as a score of 0 it would pull the Average down)
    empty.mkdir()
    (empty / "G1_instruction.json").write_text('{"588": 0}')
    (empty / "G1_tool.json").write_text("{}")
    cases.append(
        (
            ["--answers", str(stb_answers), "--ids", str(empty), "--out", str(tmp_path / "o"), "--no-progress"]
            + ["--base-url", faulty_judge.base_url, "--model", "m"],
            "G1_tool.json: no query ids",
        )
    )
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    under_a_file = ["--answers", str(stb_answers), "--ids", ids, "--out", str(a_file / "fac"), "--no-progress"]
    cases.append((under_a_file + ["--base-url", faulty_judge.base_url, "--model", "m"], "is a file, not a folder"))
    for argv, message in cases:
        assert fac(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("fac.py: error:") and message in err[-1] and "Traceback" not in "\n".join(err)
    # Verdicts of another judge in the same folder are never mixed in.
    assert fac(common + ["--base-url", faulty_judge.base_url, "--model", faulty_judge.model]) == 0
    assert fac(common + ["--base-url", faulty_judge.base_url, "--model", "another-judge"]) == 2
    assert "holds fac verdicts of judge 'fake-judge'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        fac(["--help"])
    assert exit_.value.code == 0


def test_a_changed_answer_is_judged_again(eval_cli, faulty_judge, stb_answers, samples, tmp_path):
    answers, argv = _copied_answers(stb_answers, samples, faulty_judge, tmp_path, "out")
    assert eval_cli("fac")(argv) == 0 and faulty_judge.requests == JUDGED_EXAMPLE_ANSWERS
    file = answers / "virtual_chatgpt_cot" / "G1_instruction.json"
    data = json.loads(file.read_text())
    data["588"]["answer"]["final_answer"] = json.dumps({"return_type": "give_answer", "final_answer": "Barcelona."})
    file.write_text(json.dumps(data))
    assert eval_cli("fac")(argv) == 0 and faulty_judge.requests == JUDGED_EXAMPLE_ANSWERS + 1
    record = next(
        r
        for r in _lines(tmp_path / "out" / "answers.jsonl")
        if (r["model"], r["query_id"]) == ("virtual_chatgpt_cot", "588")
    )
    assert (record["status"], record["answer"], record["judged"]) == ("answer", "Barcelona.", True)


def test_concurrency_default_follows_the_engine(tiny_engine, faulty_judge):
    """Without --concurrency: 2 requests in flight on `transformers serve` (one generation at a time), 16 on
    an engine whose /v1/models lists the model as `owned_by: vllm`, as vLLM's does."""

    async def default(base_url: str, model: str) -> int:
        engine = EngineClient(base_url, model)
        try:
            return await engine_concurrency(engine)
        finally:
            await engine.aclose()

    assert asyncio.run(default(tiny_engine.base_url, tiny_engine.model)) == 2
    assert asyncio.run(default(faulty_judge.base_url, faulty_judge.model)) == 2  # lists no owner
    faulty_judge.owned_by = "vllm"
    assert asyncio.run(default(faulty_judge.base_url, faulty_judge.model)) == 16
