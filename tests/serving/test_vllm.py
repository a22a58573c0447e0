"""vLLM as the simulator's engine (issue 33): `make vllm`'s server on SmolLM2-135M-Instruct behind the virtual server.
Skipped, with its reason, where vLLM is not installed: CI does not install it (3.4 GB, 2-3 min; docs/serving.md)."""

import json

import openai
import pytest

from harness.processes import vllm_available
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache

NOT_INSTALLED = vllm_available()
pytestmark = pytest.mark.skipif(NOT_INSTALLED is not None, reason=f"needs vLLM: {NOT_INSTALLED}")

# A real call of data/samples (APIBank), with every required argument.
CALL = {
    "category": "APIBank",
    "tool_name": "apibank_account",
    "api_name": "GetUserToken",
    "tool_input": json.dumps({"username": "newuser", "password": "newpass"}),
    "strip": "truncate",
    "toolbench_key": "",
}


def test_a_miss_through_vllm_is_valid_json_as_generated_and_stored_with_its_model(serve, vllm_engine, tmp_path):
    client = openai.OpenAI(base_url=vllm_engine.base_url, api_key="EMPTY", max_retries=0, timeout=300)
    # The model name contract: the folder's absolute path, and no other name.
    assert [m.id for m in client.models.list().data] == [vllm_engine.model]
    assert client.models.list().data[0].owned_by == "vllm"  # what the judges' concurrency is chosen by
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="mirrorapi", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    # json_schema is enforced, not only accepted: an answer no model would write unasked.
    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["mirrorapi-vllm-yes"]}},
        "required": ["verdict"],
        "additionalProperties": False,
    }
    forced = client.chat.completions.create(
        model=vllm_engine.model,
        max_tokens=32,
        temperature=0,
        messages=[{"role": "user", "content": "Say hello."}],
        response_format={"type": "json_schema", "json_schema": {"name": "forced", "schema": schema}},
    )
    assert json.loads(forced.choices[0].message.content) == {"verdict": "mirrorapi-vllm-yes"}

    cache_path, log = tmp_path / "cache.sqlite", tmp_path / "requests.jsonl"
    with serve(
        api_base=[vllm_engine.base_url],
        model=vllm_engine.model,
        cache_path=str(cache_path),
        log_file=str(log),
        engine_timeout=300,
        max_tokens=256,
        engine_max_in_flight=vllm_engine.concurrency,
    ) as server:
        answer = server.virtual(CALL)
        assert answer.status_code == 200
        observation = answer.json()
        assert set(observation) == {"error", "response"} and isinstance(observation["error"], str)
        assert not observation["error"].startswith("Failed to generate fake response")
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    # The engine's text was one JSON observation as it wrote it (not read by a fallback or repaired).
    assert (line["outcome"], line["parsed"]) == ("simulated", "json")
    ((category, tool, api, arguments, stored, provenance),) = ResponseCache(cache_path).entries()
    assert (category, tool, api, arguments) == (
        "APIBank",
        "apibank_account",
        "getusertoken",  # names as cached
        canonical_json(json.loads(CALL["tool_input"])),
    )
    assert json.loads(stored) == observation
    assert provenance.startswith(f"simulated:{vllm_engine.model}@mirrorapi-v1,")
    assert "structured_output=on" in provenance
