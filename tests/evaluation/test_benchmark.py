"""The one-command benchmark: RECORDED agents (replays of StableToolBench's ChatGPT runs, the only stand-in),
a real replay-mode virtual server, the tiny model as judge (untrained: formats and counts are checked, not
verdicts); one report with StableToolBench's tables."""

from __future__ import annotations

import json
import shutil

from harness.processes import free_port
from harness.recorded_agent import serve_recorded_agent
from harness.recorded_benchmark import main as recorded_benchmark_main
from harness.recorded_benchmark import recorded_benchmark
from mirrorapi.cli import main as mirrorapi_main
from mirrorapi.evaluation.judge.scoring import JudgeSettings


def test_recorded_benchmark_writes_one_report(samples, tiny_engine, tmp_path):
    judge = JudgeSettings(base_urls=[tiny_engine.base_url], model=tiny_engine.model, max_tokens=8)
    result = recorded_benchmark(samples / "stabletoolbench", samples / "tools", judge, tmp_path, repeats=1, limit=2)
    assert result.complete
    report = result.report.read_text()
    for title in ("## SoPR", "## SoWR", "## FAC", "## Agent runs"):
        assert title in report
    assert report.count("| Method | I1 Inst | Average |") == 3
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["rows"] == ["chatgpt_replay_cot", "chatgpt_replay_dfs"]
    assert summary["reference"] == "chatgpt_replay_cot"
    # StableToolBench's own runs of the first two queries: CoT finished 608 but not 588; DFS finished both.
    counts = summary["agent_counts"]
    assert counts["chatgpt_replay_cot"]["G1_instruction"] == {
        **counts["chatgpt_replay_cot"]["G1_instruction"],
        "answered": 2,
        "give_answer": 1,
        "no_finish": 1,
    }
    assert counts["chatgpt_replay_dfs"]["G1_instruction"]["give_answer"] == 2
    assert (tmp_path / "report.png").stat().st_size > 1000
    sowr = json.loads((tmp_path / "scores" / "sowr.json").read_text())
    assert [row["model"] for row in sowr["rows"]] == ["chatgpt_replay_dfs"]
    # ToolEyes' rule-based parts: every call of those runs names a listed tool with its required parameters
    # and well-formed arguments (checked by hand in data/samples), so tool reality is 100, and so is s_FA but for
    # the CoT run's answer that never finished (588: 6 calls, and the forced ill-formatted turn ToolEyes' runner
    # ends such a conversation with: 6 of 7, so (1 + 6/7) / 2 for the group).
    assert "## ToolEyes (rule-based parts)" in report
    assert "| chatgpt_replay_cot | G1_instruction | 2 | 92.86 | — | — | — | — | — | 100.00 |" in report
    assert "| chatgpt_replay_dfs | G1_instruction | 2 | 100.00 | — | — | — | — | — | 100.00 |" in report


def test_benchmark_rejects_an_unknown_method(capsys, tmp_path):
    code = mirrorapi_main(
        [
            "benchmark",
            "--queries",
            str(tmp_path),
            "--server",
            "http://127.0.0.1:9/virtual",
            "--agent",
            "a",
            "m",
            "http://127.0.0.1:9/v1",
            "--methods",
            "ReAct",
            "--out",
            str(tmp_path),
            "--judge-base-url",
            "http://127.0.0.1:9/v1",
            "--judge-model",
            "j",
        ]
    )
    assert code == 2
    assert "unknown method 'ReAct'" in capsys.readouterr().err


def test_recorded_benchmark_with_a_text_protocol_agent_beside_the_replays(samples, tiny_engine, tmp_path, capsys):
    """A third row from an agent in the agent-react-v1 text protocol (the RECORDED CoT run replayed as text),
    through the `python -m` entry, with a simulator (the tiny model) for what the cache lacks."""
    stb = samples / "stabletoolbench"
    with serve_recorded_agent(
        [stb / "data_example" / "answer" / "virtual_chatgpt_cot"], free_port(), text_protocol=True
    ) as (base_url, agent):
        code = recorded_benchmark_main(
            [
                "--out",
                str(tmp_path),
                "--limit",
                "2",
                "--agent",
                "text_replay",
                "recorded-agent",
                base_url,
                "--agent-format",
                "text_replay",
                "agent-react-v1",
                "--simulator-base-url",
                tiny_engine.base_url,
                "--simulator-model",
                tiny_engine.model,
                "--judge-base-url",
                tiny_engine.base_url,
                "--judge-model",
                tiny_engine.model,
                "--judge-max-tokens",
                "8",
            ]
        )
        assert code == 0
        assert agent.bodies and all("tools" not in body for body in agent.bodies)
    assert "| text_replay_cot | I1 Inst |" in capsys.readouterr().out
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["rows"] == ["chatgpt_replay_cot", "chatgpt_replay_dfs", "text_replay_cot"]
    assert summary["agents"]["text_replay_cot"]["prompt_format"] == "agent-react-v1"
    # The same recorded run, in text or in tool calls, ends the same way: 608 answered, 588 without Finish.
    counts = summary["agent_counts"]
    assert counts["text_replay_cot"] == counts["chatgpt_replay_cot"]


def test_a_cot_give_up_is_counted_as_one(samples, tmp_path):
    # StableToolBench's single_chain writes a give-up as `valid_data` false and `final_answer` "", its chain ending
    # in the Finish call whose observation code is 4; DFS puts the Finish arguments in `final_answer`. A real CoT
    # answer of the sample, made into such a give-up, beside two real answers (588's DFS tree holds a give-up on
    # a branch it left, then answers: an answer).
    from mirrorapi.evaluation.benchmark import run_counts

    example = samples / "stabletoolbench" / "data_example" / "answer"
    group = tmp_path / "answer" / "G1_instruction"
    group.mkdir(parents=True)
    answer = json.loads((example / "virtual_chatgpt_cot" / "G1_instruction" / "1073_CoT@1.json").read_text())
    answer["answer_generation"].update(valid_data=False, final_answer="")
    last = answer["trys"][-1]["chain"][-1]
    last.update(description='{"return_type": "give_up_and_restart"}', observation_code=4)
    (group / "1073_CoT@1.json").write_text(json.dumps(answer))
    shutil.copy(example / "virtual_chatgpt_dfs" / "G1_instruction" / "588_DFS_woFilter_w2.json", group)
    shutil.copy(example / "virtual_chatgpt_cot" / "G1_instruction" / "608_CoT@1.json", group)
    counts = run_counts(tmp_path, ["G1_instruction"])["G1_instruction"]
    assert (counts["answered"], counts["give_up"], counts["give_answer"], counts["no_finish"]) == (3, 1, 2, 0)
