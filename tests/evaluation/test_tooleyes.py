"""ToolEyes' capability scores (mirrorapi/evaluation/benchmarks/tooleyes.py) on StableToolBench's recorded
trajectories.

Expected values are computed by hand from ToolEyes' formulas (arXiv 2401.00741; Junjie-Ye/ToolEyes
Code/Evaluation/util/utils.py at c818fcebe017951570a25e552a7984e40093fd52):
s_FA = well-formatted turns / turns; tool reality = 1 - (hallucinated tools + calls with a missing required or
unlisted parameter) / well-formatted calls; s_IC = focus/10; s_BP = validity/10 * quality/10;
s_TS = tool reality * selection/10; s_AO = relevance/10; overall = the mean of the five.
"""

import contextlib
import json
import shutil

import pytest
from fastapi import FastAPI

from harness.fake_engines import StatusEngine
from harness.processes import free_port, serve_in_thread
from mirrorapi.evaluation.benchmarks import tooleyes
from mirrorapi.evaluation.judge.scoring import JudgeSettings

CONVERTED = "stabletoolbench/data_example/model_predictions_converted"


def tool_nodes(record: dict) -> list[dict]:
    node, out = record["answer"]["answer_details"][0], []
    while True:
        if node["role"] == "tool":
            out.append(node["message"])
        if not node["next"]:
            return out
        node = node["next"][0]


@pytest.fixture()
def answers(samples, tmp_path):
    """StableToolBench's converted CoT/DFS answers, plus a copy with known faults (model `faulty`)."""
    folder = tmp_path / "answers"
    shutil.copytree(samples / CONVERTED, folder)
    data = json.loads((folder / "virtual_chatgpt_cot" / "G1_instruction.json").read_text())
    # 1073: keyword-analysis call 1 gets malformed arguments, call 2 a tool that does not exist; Finish stays.
    first, second, _finish = tool_nodes(data["1073"])
    first["arguments"] = '{"q": "birthday'
    second["name"] = "made_up_tool_for_keyword_analysis"
    # 588: six theclique calls; the 1st loses its required `name`, the 3rd gets an unlisted parameter.
    calls = tool_nodes(data["588"])
    calls[0]["arguments"] = "{}"
    calls[2]["arguments"] = json.dumps({"artist_name": "Lionel Messi", "country": "AR"})
    (folder / "faulty").mkdir()
    (folder / "faulty" / "G1_instruction.json").write_text(json.dumps(data))
    return folder


def by_query(result, model):
    return {r["query_id"]: r for r in result.rows if r["model"] == model}


def test_rule_based_parts_by_hand(answers):
    result = tooleyes.score(answers)
    for model in ("virtual_chatgpt_cot", "virtual_chatgpt_dfs"):
        # Every recorded call names a listed tool with exactly its required parameters (checked by hand). The CoT
        # agent's 588 made 6 calls and never finished: ToolEyes' runner adds its forced "I cannot handle the task."
        # turn, which its Format_alignment_score counts as a format error (6 of 7; upstream's function on the same
        # trajectory gives 0.8571).
        assert {q: (r["s_FA"], r["tool_reality"]) for q, r in by_query(result, model).items()} == {
            "588": (6 / 7 if model == "virtual_chatgpt_cot" else 1.0, 1.0),
            "608": (1.0, 1.0),
            "1073": (1.0, 1.0),
        }
    faulty = by_query(result, "faulty")
    assert faulty["1073"]["s_FA"] == pytest.approx(2 / 3)  # 1 malformed of 3 turns
    assert faulty["1073"]["tool_reality"] == 0.0  # the one well-formatted call is a hallucinated tool
    assert faulty["588"]["s_FA"] == 6 / 7  # its calls are well formatted; it never finished (above)
    assert faulty["588"]["tool_reality"] == pytest.approx(1 - 2 / 6)
    assert faulty["588"]["s_IC"] is None  # judged parts need a judge
    cells = tooleyes.table(result.rows)["faulty"]["All"]
    assert cells["s_FA"] == pytest.approx(100 * (2 / 3 + 6 / 7 + 1) / 3, abs=0.01)
    assert cells["tool_reality"] == pytest.approx(100 * (0 + 4 / 6 + 1) / 3, abs=0.01)


@contextlib.contextmanager
def fixed_judge(text: str):
    """A stand-in for the judge engine: always the same ratings."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    port = free_port()
    with serve_in_thread(app, port, access_log=False) as url:
        yield url + "/v1"


def test_judged_parts_follow_the_formulas(answers, tmp_path):
    with fixed_judge("Focus: 8\nValidity: 6\nQuality: 5\nSelection: 9\nRelevance: 7") as url:
        result = tooleyes.score(answers, JudgeSettings(base_urls=[url], model="judge"))
    assert result.unrated == 0
    clean = by_query(result, "virtual_chatgpt_dfs")["608"]
    assert (clean["s_IC"], clean["s_BP"], clean["s_TS"], clean["s_AO"]) == pytest.approx((0.8, 0.3, 0.9, 0.7))
    assert clean["overall"] == pytest.approx((1.0 + 0.8 + 0.3 + 0.9 + 0.7) / 5)
    faulty = by_query(result, "faulty")
    assert faulty["1073"]["s_TS"] == 0.0  # tool reality 0
    assert faulty["588"]["s_TS"] == pytest.approx((1 - 2 / 6) * 0.9)
    report = tooleyes.report_markdown(result, JudgeSettings(base_urls=[url], model="judge"))
    assert "| Model | Scenario | n | s_FA | s_IC | s_BP | s_TS | s_AO | Overall | tool reality |" in report
    assert "| faulty | G1_instruction | 3 |" in report


def test_a_rating_the_judge_does_not_give_counts_zero_as_in_tooleyes(answers):
    # ToolEyes' model_eval scores a judge answer it cannot read a score from 0 (utils.py, its `except` branches),
    # so the trajectory stays in its scenario's mean instead of leaving it.
    with fixed_judge("Focus: 8") as url:
        result = tooleyes.score(answers, JudgeSettings(base_urls=[url], model="judge"))
    assert (result.unrated, result.ratings_missing, len(result.rows)) == (0, 9, 9)
    clean = by_query(result, "virtual_chatgpt_dfs")["608"]
    assert (clean["s_IC"], clean["s_BP"], clean["s_TS"], clean["s_AO"]) == pytest.approx((0.8, 0.0, 0.0, 0.0))
    assert clean["overall"] == pytest.approx((1.0 + 0.8) / 5)
    cells = tooleyes.table(result.rows)["virtual_chatgpt_dfs"]["All"]
    assert (cells["n"], cells["rated"], cells["s_IC"], cells["s_AO"]) == (3, 3, 80.0, 0.0)


def test_a_failed_judge_call_leaves_the_trajectory_out_of_the_judged_means(answers):
    with StatusEngine(500) as engine:
        result = tooleyes.score(answers, JudgeSettings(base_urls=[engine.url], model="judge"))
    assert (result.unrated, result.ratings_missing) == (9, 0)
    assert all(r["s_AO"] is None and r["s_FA"] is not None for r in result.rows)
    cells = tooleyes.table(result.rows)["faulty"]["All"]
    assert (cells["n"], cells["rated"], cells["s_AO"]) == (3, 0, None)


def test_an_empty_action_input_is_ill_formatted_as_in_tooleyes():
    # ToolEyes' json_format_check evaluates the Action Input: eval("") fails, eval("{}") does not.
    assert not tooleyes.well_formatted({"name": "search", "arguments": ""})
    assert not tooleyes.well_formatted({"name": "search", "arguments": "  "})
    assert tooleyes.well_formatted({"name": "search", "arguments": "{}"})


@pytest.mark.parametrize("parameters", ["a string", {"properties": ["name"]}, {"properties": {}, "required": "name"}])
def test_a_tool_without_a_parameters_object_is_one_line_and_exit_2(answers, eval_cli, tmp_path, capsys, parameters):
    data = json.loads((answers / "virtual_chatgpt_cot" / "G1_instruction.json").read_text())
    record = data["1073"]
    tool = record["available_tools"][0]
    (tool.get("function") or tool)["parameters"] = parameters
    bad = tmp_path / "bad" / "model"
    bad.mkdir(parents=True)
    (bad / "G1_instruction.json").write_text(json.dumps({"1073": record}))
    assert eval_cli("tooleyes")(["--answers", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "query 1073: tool" in err and "has no parameters object" in err and "Traceback" not in err
