"""Our converter reads StableToolBench's raw answer files: the result equals its own converted files
(data/samples/stabletoolbench, copied unchanged from its data_example), in both message dialects."""

from __future__ import annotations

import copy
import json

import pytest

from mirrorapi.evaluation.answers.convert import convert_answer, convert_answer_folder

RUNS = {"virtual_chatgpt_cot": "CoT@1", "virtual_chatgpt_dfs": "DFS_woFilter_w2"}


@pytest.mark.parametrize("folder", sorted(RUNS))
def test_stabletoolbench_raw_files_convert_to_its_converted_files(samples, folder):
    stb = samples / "stabletoolbench" / "data_example"
    ours = convert_answer_folder(stb / "answer" / folder / "G1_instruction", RUNS[folder])
    theirs = json.loads((stb / "model_predictions_converted" / folder / "G1_instruction.json").read_text())
    assert sorted(ours) == sorted(theirs)
    for qid, record in theirs.items():
        assert ours[qid]["answer"] == {**record["answer"], "method": RUNS[folder]}
        assert ours[qid]["query"] == record["query"]


def _as_tool_calls_dialect(conversation: list[dict]) -> list[dict]:
    """The same conversation as StableToolBench's pipeline writes it under today's openai SDK:
    `tool_calls` + `"function_call": null` on assistant messages, `role: tool` answers with ids."""
    out, pending = [], None
    for number, message in enumerate(conversation):
        message = dict(message)
        if message["role"] == "assistant" and message.get("function_call"):
            call = message.pop("function_call")
            pending = f"call_{number}"
            message.update(tool_calls=[{"id": pending, "type": "function", "function": call}], function_call=None)
        elif message["role"] == "function":
            message = {"role": "tool", "name": message["name"], "content": message["content"], "tool_call_id": pending}
        elif message["role"] == "assistant":
            message["function_call"] = None
        out.append(message)
    return out


def test_function_call_null_is_read_as_no_function_call(samples):
    stb = samples / "stabletoolbench" / "data_example"
    raw = json.loads((stb / "answer" / "virtual_chatgpt_cot" / "G1_instruction" / "608_CoT@1.json").read_text())
    theirs = json.loads(
        (stb / "model_predictions_converted" / "virtual_chatgpt_cot" / "G1_instruction.json").read_text()
    )
    modern = copy.deepcopy(raw)
    modern["answer_generation"]["train_messages"] = [
        _as_tool_calls_dialect(m) for m in raw["answer_generation"]["train_messages"]
    ]
    assert any(m.get("function_call", "absent") is None for m in modern["answer_generation"]["train_messages"][-1])
    assert convert_answer(modern, "CoT@1")["answer"]["answer_details"] == theirs["608"]["answer"]["answer_details"]
