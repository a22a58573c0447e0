"""scripts/train_shipped_models.py's answer stage asks a served simulator as the virtual server asks it: a call the
server refuses with its default argument policy (a required argument missing) never reaches the engine, and its
answer is the server's own refusal, compared here with what a real virtual server process answers over HTTP."""

import json

import httpx
from shipped_steps.answer import served_answers

from mirrorapi.prompts.simulator_formats import simulator_messages
from mirrorapi.records import canonical_json, read_pairs_jsonl
from mirrorapi.tools import ToolRegistry


def record_of(doc, arguments: dict, real: str) -> dict:
    """A held-out record as the data build writes it (the fields the answer stage reads)."""
    return {
        "split": "test_id",
        "source": "tau-bench",
        "episode": "e",
        "step": 0,
        "category": doc.category,
        "tool": doc.tool,
        "api": doc.api,
        "arguments": canonical_json(arguments),
        "prompt_format": "mirrorapi-v2",
        "kind": "success",
        "prompt": simulator_messages(doc, arguments, [], fmt="mirrorapi-v2"),
        "completion": [{"role": "assistant", "content": real}],
    }


def test_a_call_the_server_refuses_is_answered_with_the_server_s_refusal(virtual_server, tiny_engine, samples):
    registry = ToolRegistry.load([samples / "tools"])
    pair = next(
        p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["api_name"] == "search_direct_flight"
    )  # three required arguments (origin, destination, date)
    doc = registry.get(pair["category"], pair["tool_name"], pair["api_name"])
    without_date = {k: v for k, v in pair["tool_input"].items() if k != "date"}
    real = json.dumps(pair["response"])
    refused, asked = record_of(doc, without_date, real), record_of(doc, pair["tool_input"], real)

    rows = served_answers(tiny_engine.base_url, tiny_engine.model, [refused, asked], [str(samples / "tools")], 8, True)

    url, _ = virtual_server(tiny_engine.base_url, tiny_engine.model)  # the server's default settings
    served = httpx.post(
        url + "/virtual",
        json={"category": pair["category"], "tool_name": pair["tool_name"], "api_name": pair["api_name"],
              "tool_input": json.dumps(without_date)},
        timeout=60,
    )  # fmt: skip
    assert served.status_code == 200 and served.headers["x-mirrorapi-outcome"] == "validation_error"
    assert rows[0]["answered_by"] == "server" and json.loads(rows[0]["generated"]) == served.json()
    assert "date" in served.json()["error"] and not rows[0]["cut"]
    # the complete call is the engine's to answer: its 8 tokens, counted by the engine
    assert "answered_by" not in rows[1] and rows[1]["cut"]
    assert [r["target"] for r in rows] == [real, real]


def test_the_score_stage_reads_a_model_s_text_as_a_virtual_server_serves_it(virtual_server):
    # An empty text and text that is no observation are failures on a server (what the agent gets): the score stage
    # scores them so, not as successes holding the text. Compared with what a real server process answers for
    # each text, given by a stand-in engine (a real model writes such text on some calls only, never on demand).
    from shipped_steps.score import served_observation

    from harness.fake_engines import StubEngine, chat_completion_reply

    texts = [
        "",
        "I am sorry, I cannot simulate this API.",
        '{"error": "", "response": {"players": []}}',
        '{"error": "", "response": "' + "Messi " * 500 + '"}',  # a string response past what a server serves whole
    ]
    with StubEngine(model="simulator") as engine:
        url, _ = virtual_server(engine.url, "simulator")
        for number, text in enumerate(texts):
            engine.reply = chat_completion_reply(text)
            body = {
                "category": "Data",
                "tool_name": "theclique",
                "api_name": "transfermarkt_search",
                "tool_input": json.dumps({"name": f"player {number}"}),  # a new call each time: never a cache hit
            }
            served = httpx.post(url + "/virtual", json=body, timeout=30).json()
            assert served_observation(text)[0] == served, text
            assert bool(served["error"]) == (number < 2)
