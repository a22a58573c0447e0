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


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_an_engine_status_it_is_retried_for_is_transient_to_the_client(status):
    """The engine client asks again on 5xx, 408 and 429; the server told its clients "retry" (`x-mirrorapi-retry`, an
    OpenEnv step not taken) for 429, 502 and 503 only, so a crashed engine's 500 became a taken step with an error
    observation. One rule now."""
    failure = to_failure(EngineError("http", f"engine answered HTTP {status}: oops", status=status))
    assert failure.outcome == "engine_error" and failure.transient


@pytest.mark.parametrize(
    "status, engine_text, reason",
    [
        (
            400,
            "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens",
            "the call is too long for the simulator's context (the engine answered HTTP 400)",
        ),
        (404, "No model `sim`.", "the simulator engine does not serve the configured model (HTTP 404)"),
        (422, "bad request", "the simulator engine answered HTTP 422"),
    ],
    ids=["context", "model", "other"],
)
def test_an_engine_refusal_is_said_in_words_the_agent_can_act_on(status, engine_text, reason):
    """vLLM's refusals of a call (its prompt past the context, a model it does not serve) all read "the simulator
    engine failed"; the engine's own text (which may name its model path) stays in the log."""
    error = EngineError("http", f'engine answered HTTP {status}: {{"message": "{engine_text}"}}', status=status)
    failure = to_failure(error)
    assert agent_sees(error) == f"{PREFIX} ({reason})" and not failure.transient
