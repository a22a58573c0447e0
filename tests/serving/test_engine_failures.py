"""What the agent is told when the engine's answer is unusable: what was wrong, never a vague
"output was empty" (issue 11). The HTTP bodies are the exact bytes a broken proxy or a non-OpenAI
server answers; the model texts are what an untrained or mis-prompted model writes."""

import json

import pytest

from mirrorapi.engine_client import EngineError, _json_body, _message
from mirrorapi.serving.handler import to_failure
from mirrorapi.serving.simulator import unusable_output

PREFIX = "Failed to generate fake response"


def agent_sees(error: EngineError) -> str:
    failure = to_failure(error)
    assert failure.status == 200 and failure.outcome == "engine_error"
    return json.loads(failure.body)["error"]


@pytest.mark.parametrize(
    "http_body, kind, reason",
    [
        (b"<html><body>502 Bad Gateway</body></html>", "not_json", "the simulator engine's answer is not JSON"),
        (b'{"foo": 1}', "no_choice", "the simulator engine's answer is not a chat completion (no choices)"),
        (b'{"choices": []}', "no_choice", "the simulator engine's answer is not a chat completion (no choices)"),
    ],
    ids=["html", "foo", "no-choices"],
)
def test_an_engine_answer_that_is_no_chat_completion(http_body, kind, reason):
    with pytest.raises(EngineError) as err:
        _message(_json_body(http_body))
    assert err.value.kind == kind
    assert agent_sees(err.value) == f"{PREFIX} ({reason})"


@pytest.mark.parametrize(
    "model_text, reason",
    [
        ('{"foo": 1}', 'the simulator\'s output was a JSON object without "error" or "response" (keys: \'foo\')'),
        ("[1, 2]", 'the simulator\'s output was a JSON list, not an {"error", "response"} object'),
        ("Sure! Here is the response", "the simulator's output was not JSON (26 characters)"),
    ],
    ids=["foo", "list", "prose"],
)
def test_model_text_that_is_no_observation(model_text, reason):
    assert unusable_output(model_text) == reason
    assert agent_sees(EngineError("garbage", unusable_output(model_text))) == f"{PREFIX} ({reason})"


def test_empty_model_text():
    assert agent_sees(EngineError("empty", "no text")) == f"{PREFIX} (the simulator's output was empty)"
