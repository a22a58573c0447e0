"""The success path: a cache miss answered by the tiny simulator trained on data/samples (issue 4's
`simulator_engine`, format mirrorapi-v1), stored with its provenance, then served as a hit."""

import json
from urllib.parse import unquote

import pytest
from datasets import load_from_disk

from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.tools import ToolRegistry


@pytest.fixture(scope="module")
def trained_calls(simulator_sft_dir, sample_tools) -> list[dict]:
    """Bodies of calls the simulator was trained on (the first training records), complete calls only
    (a call without a required argument is rejected before the engine by the default policy)."""
    registry = ToolRegistry.load([sample_tools])
    bodies = []
    for record in load_from_disk(str(simulator_sft_dir))["train"].select(range(48)):
        doc = registry.resolve(record["category"], record["tool"], record["api"])
        arguments = json.loads(record["arguments"])
        if all(name in arguments for name in doc.parameter_names()[0]):
            bodies.append(
                {
                    "category": doc.category,
                    "tool_name": doc.tool,
                    "api_name": doc.api,
                    "tool_input": json.dumps(arguments),
                    "strip": "truncate",
                    "toolbench_key": "",
                }
            )
    assert len(bodies) >= 2
    return bodies


@pytest.mark.slow
def test_miss_is_simulated_stored_with_provenance_then_a_hit(serve, simulator_engine, trained_calls, tmp_path):
    cache_path = tmp_path / "c.sqlite"
    with serve(
        api_base=[simulator_engine.base_url],
        model=simulator_engine.model,
        cache_path=str(cache_path),
        engine_timeout=120,
    ) as server:
        body = trained_calls[0]
        first = server.virtual(body)
        assert first.status_code == 200
        observation = first.json()
        assert set(observation) == {"error", "response"} and isinstance(observation["error"], str)
        assert not observation["error"].startswith("Failed to generate fake response")
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 1
        assert server.metric("mirrorapi_engine_calls_total", result="ok") == 1

        second = server.virtual(body)
        assert second.content == first.content
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 1
        assert server.metric("mirrorapi_engine_calls_total", result="ok") == 1  # not asked again

    cache = ResponseCache(cache_path)
    ((category, tool, api, arguments, stored, provenance),) = cache.entries()
    assert (category, tool, api) == (body["category"], body["tool_name"], body["api_name"])
    assert arguments == canonical_json(json.loads(body["tool_input"]))
    assert json.loads(stored) == observation
    # The simulator identity: model, prompt format and the default decoding settings.
    assert (
        provenance == f"simulated:{simulator_engine.model}@mirrorapi-v1,temperature=0,structured_output=on,few_shot=0,"
        "second_try=0.7"
    )
    assert cache.stats()["hits"] == 1
    # Each answer says how it was given (headers beside StableToolBench's body): simulated, then a hit, both
    # with the provenance stored.
    assert [
        (r.headers["x-mirrorapi-outcome"], unquote(r.headers["x-mirrorapi-provenance"])) for r in (first, second)
    ] == [("simulated", provenance), ("hit", provenance)]


@pytest.mark.slow
def test_is_save_false_stores_nothing(serve, simulator_engine, trained_calls, tmp_path):
    with serve(
        api_base=[simulator_engine.base_url],
        model=simulator_engine.model,
        is_save=False,
        cache_path=str(tmp_path / "c.sqlite"),
        engine_timeout=120,
    ) as server:
        body = trained_calls[1]
        answers = [server.virtual(body).json() for _ in range(2)]
        assert all(not a["error"].startswith("Failed to generate fake response") for a in answers)
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 2  # no hit: nothing was kept
        assert server.metric("mirrorapi_engine_calls_total", result="ok") == 2
    assert ResponseCache(tmp_path / "c.sqlite").count() == 0
