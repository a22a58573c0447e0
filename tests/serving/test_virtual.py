"""POST /virtual on a real uvicorn: StableToolBench's request bodies, imported real answers, bad input."""

import json
from pathlib import Path

import pytest

from harness.processes import free_port, poll_until
from mirrorapi.names import api_key_name, standardize
from mirrorapi.records import canonical_json, parse_repr_key


@pytest.fixture(scope="module")
def imported(serve, stb_cache, tmp_path_factory):
    """A server whose cache holds a StableToolBench cache folder built from real pairs; no engine
    listens (misses fail fast), so everything answered here comes from the cache or the checks."""
    folder, _ = stb_cache
    db = tmp_path_factory.mktemp("db")
    with serve(
        cache_folder=str(folder),
        cache_path=str(db / "c.sqlite"),
        log_file=str(db / "requests.jsonl"),
        api_base=[f"http://127.0.0.1:{free_port()}/v1"],
        engine_timeout=2,
        engine_retries=0,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def recorded(real_pairs, stb_cache):
    """(pair, the observation StableToolBench's file holds for it) for the pairs whose call is
    first in its file (equal calls keyed differently: the first one is kept)."""
    _, written = stb_cache
    first = {}
    for (category, tool, api, key), observation in written.items():
        first.setdefault((category, tool, api, canonical_json(parse_repr_key(key))), (key, observation))
    out = []
    for pair in real_pairs:
        names = (pair["category"], standardize(pair["tool_name"]), api_key_name(pair["api_name"]))
        key, observation = first[(*names, canonical_json(pair["tool_input"]))]
        if key == str(pair["tool_input"]):
            out.append((pair, observation))
    return out


def test_recorded_answers_are_served_as_hits(imported, recorded, agent):
    by_source = {}
    for pair, observation in recorded:
        by_source.setdefault(pair["source"], []).append((pair, observation))
    chosen = [item for items in by_source.values() for item in items[:: max(1, len(items) // 5)][:5]]
    hits = imported.metric("mirrorapi_requests_total", outcome="hit")
    log = Path(imported.app.server.settings.log_file)
    logged = log.read_text().count("\n") if log.exists() else 0
    for pair, observation in chosen:
        response = imported.virtual(agent(pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"]))
        assert response.status_code == 200
        assert response.json() == observation, pair
        assert response.headers["x-mirrorapi-outcome"] == "hit"
        assert response.headers["x-mirrorapi-provenance"] == "imported:tool_response_cache"
    assert imported.metric("mirrorapi_requests_total", outcome="hit") == hits + len(chosen)
    # lines are written right after the event-loop turn that answered
    poll_until(
        lambda: True if len(log.read_text().splitlines()) >= logged + len(chosen) else None,
        5,
        "request log lines",
        interval=0.02,
    )
    lines = [json.loads(line) for line in log.read_text().splitlines()[logged:]]
    assert len(lines) == len(chosen)
    assert {line["outcome"] for line in lines} == {"hit"}
    assert {line["provenance"] for line in lines} == {"imported:tool_response_cache"}


def test_agent_name_forms_and_object_input_hit_the_same_entry(imported, recorded, agent):
    pair, observation = next((p, o) for p, o in recorded if p["source"] == "toolbench-example" and p["tool_input"])
    body = agent(pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"])
    reordered = dict(reversed(list(pair["tool_input"].items())))
    variants = [
        body,
        {**body, "tool_name": f"{body['tool_name']}_for_{pair['category']}"},  # how its cache folders name tools
        {**body, "api_name": f"{body['api_name']}_for_{body['tool_name']}"},  # the agent's function name
        {**body, "tool_input": reordered},  # an object, keys in another order
        {k: v for k, v in body.items() if k not in ("strip", "toolbench_key")},  # optional fields absent
        {**body, "unexpected_field": 1},  # extra fields are allowed (and logged)
    ]
    for variant in variants:
        response = imported.virtual(variant)
        assert (response.status_code, response.json()) == (200, observation), variant
    # A service URL ending in a slash: StableToolBench's FastAPI server redirects /virtual/ to its /virtual route,
    # and its client's `requests.post` follows with the body, so such a URL works there; answered here directly.
    slashed = imported.client.post("/virtual/", json=body)
    assert (slashed.status_code, slashed.json()) == (200, observation)


def test_special_error_strings_pass_through_unchanged(imported, recorded, agent):
    pair, observation = next((p, o) for p, o in recorded if p["response"]["error"] == "Message error...")
    response = imported.virtual(agent(pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"]))
    assert response.json()["error"] == "Message error..." and response.json() == observation


@pytest.mark.parametrize("api_name", ["chat_with_user", "Chat With User", "chat_with_user_for_no_such_tool"])
def test_chat_with_user(imported, api_name):
    body = {"category": "Data", "tool_name": "no_such_tool", "api_name": api_name, "tool_input": "not json"}
    assert imported.virtual(body).json() == {"error": "", "response": "Chat with user."}


@pytest.mark.parametrize(
    "change, error",
    [
        ({"category": "Sportz"}, "Unknown category 'Sportz'. Closest known: Sports."),
        ({"tool_name": "theclique2"}, "Unknown tool 'theclique2' in category 'Data'. Closest known: theclique."),
        (
            {"api_name": "transfermarkt_serch"},
            "Unknown API 'transfermarkt_serch' for tool 'theclique' in category "
            "'Data'. Closest known: transfermarkt_search",
        ),
        ({"tool_input": '["Lionel Messi"]'}, "Tool input parse error...\ntool_input must be a JSON object, got list"),
        ({"tool_input": "{'name': 'Lionel Messi'}"}, "Tool input parse error...\ntool_input is not valid JSON"),
        ({"tool_input": 42}, "Tool input parse error...\ntool_input must be a JSON object or a string"),
        ({"tool_input": "{}"}, "Missing required parameter 'name' of Transfermarkt search (TheClique)."),
    ],
    ids=["category", "tool", "api", "input-list", "input-repr", "input-number", "missing-required"],
)
def test_mistakes_at_the_api_level_are_observations(imported, change, error):
    body = {
        "category": "Data",
        "tool_name": "theclique",
        "api_name": "transfermarkt_search",
        "tool_input": '{\n  "name": "Lionel Messi"\n}',
        "strip": "truncate",
        "toolbench_key": "",
        **change,
    }
    calls = imported.metric("mirrorapi_engine_calls_total", result="unreachable")
    response = imported.virtual(body)
    assert response.status_code == 200
    assert set(response.json()) == {"error", "response"} and response.json()["response"] == ""
    assert response.json()["error"].startswith(error)
    assert imported.metric("mirrorapi_engine_calls_total", result="unreachable") == calls  # never asked
    assert response.headers["x-mirrorapi-outcome"] == "validation_error"
    assert "x-mirrorapi-provenance" not in response.headers  # nothing was looked up or simulated


@pytest.mark.parametrize(
    "body",
    [
        b'{"category": "Data", "tool_name": "theclique", "api_name": "transfermarkt_search"}',
        b'{"category": "Data", "tool_name": "theclique", "api_name": ',
        b'[{"category": "Data"}]',
        b'{"category": {"a": 1}, "tool_name": "theclique", "api_name": "x", "tool_input": "{}"}',
        b"",
    ],
    ids=["missing-field", "not-json", "list", "wrong-type", "empty"],
)
def test_body_not_of_the_contract_shape_is_422(imported, body):
    response = imported.virtual(body)
    assert response.status_code == 422
    assert response.json()["error"].startswith("Invalid request body: ") and response.json()["response"] == ""


def test_engine_down_miss_is_an_error_observation_not_cached(imported):
    body = {
        "category": "Data",
        "tool_name": "theclique",
        "api_name": "transfermarkt_search",
        "tool_input": '{"name": "nobody recorded this"}',
    }
    entries = imported.client.get("/health").json()["cache"]["entries"]
    for _ in range(2):
        response = imported.virtual(body)
        assert response.status_code == 200
        assert response.json() == {
            "error": "Failed to generate fake response (the simulator engine is unreachable)",
            "response": "",
        }
        assert response.headers["x-mirrorapi-outcome"] == "engine_error"
    response = imported.client.get("/health")
    health = response.json()
    assert health["cache"]["entries"] == entries
    # No replica can simulate: 503, and the body says that hits are still served.
    assert response.status_code == 503
    assert health["status"] == "unavailable" and health["engine"][0]["reachable"] is False
    assert health["misses"].startswith("not simulated") and "cache hits are still served" in health["misses"]
    assert imported.metric("mirrorapi_engine_calls_total", result="unreachable") >= 2


def test_a_cached_answer_of_an_api_the_tools_folder_lacks_is_served_as_stabletoolbench_serves_it(
    serve, agent, tmp_path
):
    """StableToolBench's server answers a cached call before it looks for a doc (server/main.py, "load from
    cache", its cache path from `prepare_tool_name_and_url`), so its `tool_response_cache` answers APIs its tools
    folder lacks (a query's own API list: 625 of the 2,490 APIs of the test queries are not in ToolEnv2404). The
    file is written as its server writes one: `<category>/<tool>_for_<category>/<api>.json`, keys str(arguments)."""
    folder = tmp_path / "tool_response_cache"
    (folder / "Tools" / "onboarding_project_v3_for_Tools").mkdir(parents=True)
    observation = {"error": "", "response": "{'products': [{'id': 7, 'name': 'Widget'}]}"}
    (folder / "Tools" / "onboarding_project_v3_for_Tools" / "get_products.json").write_text(
        json.dumps({str({"limit": 5}): observation}, indent=4)
    )
    with serve(
        cache_folder=str(folder),
        cache_path=str(tmp_path / "c.sqlite"),
        api_base=[f"http://127.0.0.1:{free_port()}/v1"],
        engine_timeout=2,
        engine_retries=0,
    ) as server:
        # the names as StableToolBench's client sends them (standardized; the API also as its function name, which
        # upstream's server cuts at `_for_<tool>`), and as a query's api_list writes them
        body = agent("Tools", "Onboarding project v3", "Get Products", {"limit": 5})
        assert (body["tool_name"], body["api_name"]) == ("onboarding_project_v3", "get_products")
        for tool, api in (
            (body["tool_name"], "get_products_for_onboarding_project_v3"),
            ("Onboarding project v3", "Get Products"),
        ):
            response = server.virtual({**body, "tool_name": tool, "api_name": api})
            assert response.status_code == 200 and response.json() == observation
            assert response.headers["x-mirrorapi-outcome"] == "hit"
        response = server.virtual(body)
        assert response.json() == observation and response.headers["x-mirrorapi-outcome"] == "hit"
        # another call of that API, or another API, is still unknown: no doc to simulate it from
        for arguments, api in (({"limit": 6}, "get_products"), ({"limit": 5}, "get_orders")):
            error = server.virtual(agent("Tools", "Onboarding project v3", api, arguments)).json()["error"]
            assert error.startswith("Unknown category 'Tools'")  # the sample tools folder has no such category
