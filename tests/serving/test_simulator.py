"""Few-shot examples: recorded entries of the same API only, chosen by similarity, within a budget."""

import asyncio
import json

import pytest

from mirrorapi.few_shot import FEW_SHOT_CANDIDATES, select_examples
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import ToolRegistry


def candidates(*calls: dict) -> list[tuple[str, str]]:
    return sorted((canonical_json(c), json.dumps({"error": "", "response": f"r{i}"})) for i, c in enumerate(calls))


def test_examples_are_the_most_similar_calls_in_a_stable_order():
    pool = candidates(
        {"city": "Rome", "days": 5}, {"city": "Paris", "days": 5}, {"city": "Paris", "days": 3}, {"zip": "75001"}
    )
    chosen = select_examples(pool, {"city": "Paris", "days": 3, "units": "metric"}, k=2, char_budget=10_000)
    assert [a for a, _ in chosen] == [{"city": "Paris", "days": 3}, {"city": "Paris", "days": 5}]
    assert select_examples(list(reversed(pool)), {"city": "Paris", "days": 3, "units": "metric"}, 2, 10_000) == chosen
    assert select_examples(pool, {"city": "Paris"}, k=0, char_budget=10_000) == []


def test_a_caller_s_changes_to_an_example_do_not_reach_the_next_choice():
    # Candidates are parsed once and kept for later choices (a full data build makes ~29,000 of them).
    pool = candidates({"city": "Paris", "days": 5}, {"city": "Rome", "days": 5})
    ((first, _),) = select_examples(pool, {"city": "Paris", "days": 3}, k=1, char_budget=10_000)
    first["city"] = "Oslo"
    ((again, _),) = select_examples(pool, {"city": "Paris", "days": 3}, k=1, char_budget=10_000)
    assert again == {"city": "Paris", "days": 5}
    assert select_examples(pool, {"city": "Paris", "days": 5}, k=2, char_budget=10_000) == [
        ({"city": "Rome", "days": 5}, {"error": "", "response": "r1"})  # the call itself is never its own example
    ]


def test_examples_fit_the_budget_whole():
    long = {"city": "Paris", "days": 3, "note": "x" * 500}
    pool = candidates(long, {"city": "Paris", "days": 4})
    chosen = select_examples(pool, {"city": "Paris", "days": 3, "note": "x" * 500}, k=2, char_budget=200)
    assert [a for a, _ in chosen] == [{"city": "Paris", "days": 4}]  # the closer one does not fit: skipped, not cut


def test_ties_go_to_the_shortest_or_to_the_median_size():
    # Five calls equally similar to the request (the same `city`, another `day`), answers of 1 to 5 rooms; a sixth
    # less similar. The median of the five sizes is the third's (3 rooms); with an even count the lower middle.
    rooms = [{"error": "", "response": json.dumps([f"room {r}" for r in range(n)])} for n in (4, 1, 5, 3, 2)]
    pool = [(canonical_json({"city": "Oslo", "day": d}), json.dumps(o)) for d, o in zip("MTWRF", rooms, strict=True)]
    pool.append((canonical_json({"town": "Oslo"}), json.dumps({"error": "", "response": "[]"})))
    request = {"city": "Oslo", "day": "S"}

    def shown(ties: str, k: int = 1, pool=pool) -> list[int]:
        return [len(json.loads(o["response"])) for _, o in select_examples(pool, request, k, 10_000, ties=ties)]

    assert shown("shortest") == [1] and shown("shortest", k=3) == [1, 2, 3]
    assert shown("median") == [3]
    assert shown("median", k=3) == [3, 2, 4]  # 2 and 4 rooms are equally far from 3: the shorter first
    assert shown("median", k=6)[-1] == 0  # the less similar call still comes after every tied one
    assert shown("median", pool=pool[:4]) == [3]  # 4 tied (sizes of 1, 3, 4, 5 rooms): the lower middle
    assert shown("median", pool=list(reversed(pool))) == [3]
    with pytest.raises(ValueError, match="unknown few-shot tie rule 'longest'"):
        select_examples(pool, request, 1, 10_000, ties="longest")


def test_the_tie_rule_names_the_simulator_identity_and_is_checked(samples):
    from mirrorapi.serving.config import ConfigError
    from mirrorapi.serving.simulator import simulator_identity

    base = {"tools_folder": [str(samples / "tools")], "few_shot": 1}
    shortest = simulator_identity(load_settings(overrides=base, environ={}))
    assert simulator_identity(load_settings(overrides={**base, "few_shot_ties": "shortest"}, environ={})) == shortest
    median = simulator_identity(load_settings(overrides={**base, "few_shot_ties": "median"}, environ={}))
    assert set(median.split(",")) == set(shortest.split(",")) | {"few_shot_ties=median"}
    with pytest.raises(ConfigError, match="few[_-]shot[_-]ties: Input should be 'shortest' or 'median'"):
        load_settings(overrides={**base, "few_shot_ties": "longest"}, environ={})


@pytest.fixture()
def cache_with_provenances(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    api = ("Data", "theclique", "transfermarkt_search")
    cache.put(*api, canonical_json({"name": "Messi"}), "", "recorded Messi", "real")
    cache.put(*api, canonical_json({"name": "Messi Jr"}), "", "imported Messi Jr", "imported:tool_response_cache")
    cache.put(*api, canonical_json({"name": "Messy"}), "", "invented Messy", "simulated:m@mirrorapi-v1")
    cache.put("Data", "theclique", "transfermarkt_details", canonical_json({"name": "Messi"}), "", "other API", "real")
    return cache


def test_simulator_prompt_shows_recorded_examples_only(cache_with_provenances, samples):
    settings = load_settings(overrides={"tools_folder": [str(samples / "tools")], "few_shot": 3}, environ={})
    doc = ToolRegistry.load(settings.tools_folder).resolve("Data", "theclique", "transfermarkt_search")
    simulator = Simulator(engine=None, settings=settings)
    # the candidates the server reads from its store for the API (`Responder`)
    candidates = asyncio.run(
        cache_with_provenances.recorded_examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES)
    )
    user = simulator.messages(doc, {"name": "Messi"}, candidates=candidates)[1]["content"]
    assert "imported Messi Jr" in user and "recorded Messi" not in user  # the call itself is not its example
    assert "invented Messy" not in user and "other API" not in user
    user = simulator.messages(doc, {"name": "Lionel"}, candidates=candidates)[1]["content"]
    assert "recorded Messi" in user and "imported Messi Jr" in user and "invented" not in user
    assert user.index("Examples:") < user.index('Request:\n{"name":"Lionel"}')


def test_stabletoolbench_format_uses_the_users_system_prompt(cache_with_provenances, samples, tmp_path):
    (tmp_path / "system.txt").write_text("You are the API server of the released model.", encoding="utf-8")
    settings = load_settings(
        overrides={
            "tools_folder": [str(samples / "tools")],
            "prompt_format": "stabletoolbench",
            "system_prompt_file": str(tmp_path / "system.txt"),
        },
        environ={},
    )
    doc = ToolRegistry.load(settings.tools_folder).resolve("Data", "theclique", "transfermarkt_search")
    system, user = Simulator(engine=None, settings=settings).messages(doc, {"name": "x"})
    assert system == {"role": "system", "content": "You are the API server of the released model."}
    assert user["content"].startswith("API doc:\n{'api_name': 'Transfermarkt search'")
    assert user["content"].endswith("\n\nRequest:\n{'name': 'x'}")


def test_long_examples_are_shown_shrunk_not_skipped():
    flights = [
        {"flight": f"HAT{i:03d}", "origin": "JFK", "destination": "SEA", "seats": {"economy": i}} for i in range(40)
    ]
    long_call = {"origin": "JFK", "destination": "SEA", "date": "2024-05-16"}
    pool = [
        (canonical_json(long_call), json.dumps({"error": "", "response": json.dumps(flights)})),
        (canonical_json({"origin": "LAX"}), json.dumps({"error": "", "response": "[]"})),
    ]
    request = {"origin": "JFK", "destination": "SEA", "date": "2024-05-17"}
    whole = select_examples(pool, request, k=1, char_budget=600)
    assert [a for a, _ in whole] == [{"origin": "LAX"}]  # shown whole, the nearest call does not fit: skipped
    ((arguments, observation),) = select_examples(pool, request, k=1, char_budget=600, response_chars=400)
    assert arguments == long_call
    shown = json.loads(observation["response"])  # still JSON: the first flights, whole
    assert shown == flights[: len(shown)] and 1 <= len(shown) < len(flights)
    assert len(observation["response"]) <= 400


def test_shrink_response_keeps_json_valid_and_the_shape():
    from mirrorapi.few_shot import shrink_response

    user = {"name": "Mia Li", "reservations": [f"R{i:05d}" for i in range(300)], "bio": "x" * 3000, "age": 41}
    shrunk = json.loads(shrink_response(json.dumps(user), 300))
    assert set(shrunk) == set(user) and shrunk["age"] == 41 and shrunk["name"] == "Mia Li"
    assert shrunk["reservations"] == user["reservations"][: len(shrunk["reservations"])]
    assert shrunk["bio"].endswith("...") and len(json.dumps(shrunk, separators=(",", ":"))) <= 300
    assert shrink_response("plain text " * 100, 40).endswith("...")
    assert len(shrink_response("plain text " * 100, 40)) <= 40
    assert shrink_response('{"a": 1}', 4) == '{"a":1}'  # nothing left to cut: a number stays whole
    short = '{"a": [1, 2]}'
    assert shrink_response(short, 100) is short and shrink_response(short, 0) is short


def test_examples_shrunk_name_the_simulator_identity(samples):
    from mirrorapi.serving.simulator import simulator_identity

    base = {"tools_folder": [str(samples / "tools")], "few_shot": 2}
    whole = simulator_identity(load_settings(overrides=base, environ={}))
    shrunk = simulator_identity(load_settings(overrides={**base, "few_shot_response_chars": 400}, environ={}))
    assert "few_shot_response_chars=400" in shrunk and "few_shot_response_chars" not in whole
