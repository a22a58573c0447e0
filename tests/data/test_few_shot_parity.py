"""The SFT builder and the server choose the same few-shot examples for the same recorded calls:
one selection function (`select_examples`) over one candidate order (`candidate_pool`), whatever
order the calls were recorded in."""

import asyncio
import json
import random

import pytest

from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records
from mirrorapi.few_shot import FEW_SHOT_CANDIDATES
from mirrorapi.records import canonical_json, read_pairs_jsonl
from mirrorapi.serving.cache import ResponseCache, import_pairs
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import ToolRegistry

# An API with more distinct recorded calls (331) than the 256 candidates read per API.
APIS = {("APIBank", "apibank_account", "GetUserToken")}


def served_candidates(cache, doc) -> list[tuple[str, str]]:
    """The few-shot candidates the server reads from its store for a call's API (`Responder`)."""
    return asyncio.run(cache.recorded_examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES))


@pytest.mark.shared
@pytest.mark.parametrize(
    "prompt_format,response_chars,ties", [("mirrorapi-v1", 0, "shortest"), ("mirrorapi-v2", 16, "median")]
)
def test_builder_and_server_show_the_same_examples(shared_data, tmp_path, prompt_format, response_chars, ties):
    pairs = [
        p
        for p in read_pairs_jsonl(shared_data / "pairs" / "api-bank-generated.jsonl")
        if (p["category"], p["tool_name"], p["api_name"]) in APIS
    ]
    random.Random(7).shuffle(pairs)  # recorded in no particular order
    distinct = {
        api: len(
            {canonical_json(p["tool_input"]) for p in pairs if (p["category"], p["tool_name"], p["api_name"]) == api}
        )
        for api in APIS
    }
    assert max(distinct.values()) > 256
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    tools = shared_data / "toolenv" / "realtools"
    registry = ToolRegistry.load([tools])

    # response_chars 16: every GetUserToken example ({"token": "<a 30-character token>"}) is shown shrunk
    options = SimulatorDataOptions(
        prompt_format=prompt_format,
        few_shot=3,
        few_shot_response_chars=response_chars,
        few_shot_ties=ties,
        ood_fraction=0.0,
        id_fraction=0.0,
    )
    splits, _ = build_simulator_records(read_pairs_jsonl(pairs_file), registry, options)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    import_pairs(cache, pairs_file, registry)  # what `mirrorapi cache import pairs.jsonl` does
    settings = load_settings(
        overrides={
            "tools_folder": [str(tools)],
            "few_shot": 3,
            "prompt_format": prompt_format,
            "few_shot_response_chars": response_chars,
            "few_shot_ties": ties,
        },
        environ={},
    )
    simulator = Simulator(engine=None, settings=settings)

    records = splits["train"]
    assert len(records) == sum(distinct.values())
    with_examples = shrunk = 0
    for record in records:
        doc = registry.get(record["category"], record["tool"], record["api"])
        served = simulator.messages(doc, json.loads(record["arguments"]), candidates=served_candidates(cache, doc))
        assert served == record["prompt"], record["arguments"]
        with_examples += "Examples:\n" in served[1]["content"]
        shrunk += '..."}' in served[1]["content"]
    assert with_examples == len(records)
    assert shrunk > 0 if response_chars else shrunk == 0
    cache.close()


@pytest.mark.shared
def test_with_history_the_builder_shows_what_the_server_s_cache_holds(shared_data, tmp_path):
    # With history a call is kept once per history it was made with (API-Bank's logins, tokens), maybe answered
    # differently; the server's cache holds it once, its first pair (`import_pairs`). The builder's examples were
    # drawn from every kept copy: 14 of API-Bank's recorded stateless records showed examples no server shows.
    tools = shared_data / "toolenv" / "realtools"
    registry = ToolRegistry.load([tools])
    pairs = list(read_pairs_jsonl(shared_data / "pairs" / "api-bank.jsonl"))
    options = SimulatorDataOptions(prompt_format="mirrorapi-session-v2", history=8, stateless_too=True, few_shot=2)
    splits, _ = build_simulator_records(pairs, registry, options)
    trained = {(r["source"], r["episode"], r["step"]) for r in splits["train"]}
    pairs_file = tmp_path / "train.jsonl"  # the training calls as recorded, in input order
    pairs_file.write_text(
        "".join(json.dumps(p) + "\n" for p in pairs if (p["source"], str(p["episode"]), int(p["step"])) in trained)
    )
    cache = ResponseCache(tmp_path / "cache.sqlite")
    import_pairs(cache, pairs_file, registry)
    settings = load_settings(
        overrides={"tools_folder": [str(tools)], "few_shot": 2, "prompt_format": "mirrorapi-v2"}, environ={}
    )
    simulator = Simulator(engine=None, settings=settings)
    stateless = [r for split in ("train", "test_id") for r in splits[split] if r["prompt_format"] == "mirrorapi-v2"]
    assert len(stateless) > 300
    for record in stateless:
        doc = registry.get(record["category"], record["tool"], record["api"])
        served = simulator.messages(doc, json.loads(record["arguments"]), candidates=served_candidates(cache, doc))
        assert served == record["prompt"], record["arguments"]
    cache.close()
