"""Each prompt format pinned by a golden string written from its specification, not produced by the
code under test: a change to a format shows up here and needs a new format version.

- `stabletoolbench` / `stabletoolbench-cache`: the user message StableToolBench's MirrorAPI servers
  build (server/main_mirrorapi.py and main_mirrorapi_cache.py at aa4ed9f; notes §4): the line
  `API doc:`, the Python repr of a dict with keys api_name (the doc's name; `-cache`: the normalised
  name), api_description, required_parameters and optional_parameters (the doc's lists verbatim),
  tool_description, tool_name (the client's tool name cut at its first `_for_`) and tool_category;
  a blank line; `Request:`; the repr of the arguments in the agent's order without `toolbench_key`;
  no trailing newline. The request: seed 42, max_tokens 2048, no response_format.
- `mirrorapi-v1`, `mirrorapi-v2`, `mirrorapi-session-v1`, `fac-v1`, `sopr-v1`: the layouts documented in
  mirrorapi/prompts/.
"""

import asyncio
import json

import pytest

from mirrorapi.engine_client import Completion
from mirrorapi.prompts.judge_formats import judge_messages
from mirrorapi.prompts.simulator_formats import history_line, simulator_messages
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import ToolRegistry

# ToolEnv2404 `Business/email_regex_for_lazy.json` (the fields a prompt reads, verbatim): a tool whose
# own standardized name contains `_for_`.
EMAIL_REGEX_FOR_LAZY = {
    "tool_description": "email regex for lazy",
    "name": "email-regex-for-lazy",
    "title": "email-regex-for-lazy",
    "tool_name": "email-regex-for-lazy",
    "api_list": [
        {
            "name": "email regex",
            "url": "https://email-regex-for-lazy.p.rapidapi.com/email/kjhfsdf",
            "description": "email regex return it if its an email",
            "method": "GET",
            "required_parameters": [{"name": "value", "type": "string", "description": "", "default": "kjhfsdf"}],
            "optional_parameters": [],
            "test_endpoint": "",
        }
    ],
}
SYSTEM = "The released model's own system prompt, from the user's file."


@pytest.fixture(scope="module")
def registry(samples, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools")
    (folder / "Business").mkdir()
    (folder / "Business" / "email_regex_for_lazy.json").write_text(json.dumps(EMAIL_REGEX_FOR_LAZY))
    return ToolRegistry.load([folder, samples / "tools"])


STB_DOC = (
    "{'api_name': 'email regex', 'api_description': 'email regex return it if its an email', "
    "'required_parameters': [{'name': 'value', 'type': 'string', 'description': '', 'default': 'kjhfsdf'}], "
    "'optional_parameters': [], 'tool_description': 'email regex for lazy', 'tool_name': 'email_regex', "
    "'tool_category': 'Business'}"
)
STB_REQUEST = "{'value': 'walid@example.com', 'format': 'json'}"


@pytest.mark.parametrize("client_tool_name", ["email_regex_for_lazy", "email_regex_for_lazy_for_Business"])
def test_stabletoolbench(registry, client_tool_name):
    doc = registry.resolve("Business", client_tool_name, "email_regex")
    arguments = {"value": "walid@example.com", "toolbench_key": "k", "format": "json"}
    assert simulator_messages(doc, arguments, fmt="stabletoolbench", system_prompt=SYSTEM) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "API doc:\n" + STB_DOC + "\n\nRequest:\n" + STB_REQUEST},
    ]


def test_stabletoolbench_cache(registry):
    doc = registry.resolve("Business", "email_regex_for_lazy", "email_regex")
    user = simulator_messages(
        doc, {"value": "walid@example.com", "format": "json"}, fmt="stabletoolbench-cache", system_prompt=SYSTEM
    )[1]["content"]
    assert (
        user
        == "API doc:\n"
        + STB_DOC.replace("'api_name': 'email regex'", "'api_name': 'email_regex'")
        + "\n\nRequest:\n"
        + STB_REQUEST
    )


def test_stabletoolbench_plain_tool(registry):
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    user = simulator_messages(doc, {"is_id": "EKVF"}, fmt="stabletoolbench", system_prompt=SYSTEM)[1]["content"]
    assert user == (
        "API doc:\n{'api_name': 'Transitaire', 'api_description': 'Récupère un transitaire donnée', "
        "'required_parameters': [{'name': 'id', 'type': 'string', 'description': '', "
        "'default': 'DOUANE_AGENCE_GONDRAND'}], 'optional_parameters': [], "
        "'tool_description': 'Transitaires de dédouanement en Nouvelle-Calédonie ', 'tool_name': 'transitaires', "
        "'tool_category': 'Logistics'}\n\nRequest:\n{'is_id': 'EKVF'}"
    )


class RecordingEngine:
    """Stand-in for the engine: keeps the request settings a simulation sends (a real engine does not
    show them) and answers one fixed observation."""

    def __init__(self):
        self.requests: list[dict] = []

    async def complete(self, messages, **settings):
        self.requests.append({"messages": messages, **settings})
        return Completion({"role": "assistant", "content": '{"error": "", "response": "ok"}'}, {}, "stop")


def test_stabletoolbench_request_settings_are_upstreams(registry, samples, tmp_path):
    (tmp_path / "system.txt").write_text(SYSTEM, encoding="utf-8")
    base = {
        "tools_folder": [str(samples / "tools")],
        "prompt_format": "stabletoolbench",
        "system_prompt_file": str(tmp_path / "system.txt"),
        "is_save": False,
    }
    settings = load_settings(overrides=base, environ={})
    engine = RecordingEngine()
    doc = registry.resolve("Business", "email_regex_for_lazy", "email_regex")
    asyncio.run(Simulator(engine, settings=settings).simulate(doc, {"value": "a"}))
    sent = engine.requests[0]
    assert (sent["seed"], sent["max_tokens"], sent["response_format"]) == (42, 2048, None)
    assert sent["messages"][1]["content"].endswith("\n\nRequest:\n{'value': 'a'}")
    # Each stays a setting: what the user sets wins.
    chosen = load_settings(overrides={**base, "seed": 7, "max_tokens": 512, "structured_output": True}, environ={})
    assert (chosen.seed, chosen.max_tokens, chosen.structured_output) == (7, 512, True)
    ours = load_settings(overrides={"tools_folder": [str(samples / "tools")]}, environ={})
    assert (ours.seed, ours.max_tokens, ours.structured_output) == (None, 1024, True)


MIRRORAPI_V1_SYSTEM = (
    "You are the server behind a web API. You receive the API's documentation and one request, and you "
    'answer exactly as the real API would. Reply with a single JSON object with two keys: "error" (an '
    'empty string when the call succeeds, otherwise the error message the API returns) and "response" '
    "(the API's output). Follow the documented response format when one is given. Reject a request the "
    "real API would reject, such as one missing a required parameter or with an invalid value. "
    "Output nothing but the JSON object."
)


def test_mirrorapi_v1(registry):
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    messages = simulator_messages(
        doc, {"is_id": "EKVF"}, [({"is_id": "DOUANE_AGENCE_GONDRAND"}, {"error": "", "response": "Gondrand, Nouméa"})]
    )
    assert messages == [
        {"role": "system", "content": MIRRORAPI_V1_SYSTEM},
        {
            "role": "user",
            "content": 'API documentation:\n{"category":"Logistics","tool":"Transitaires",'
            '"tool_description":"Transitaires de dédouanement en Nouvelle-Calédonie","api":"Transitaire",'
            '"api_description":"Récupère un transitaire donnée","method":"GET",'
            '"required_parameters":[{"name":"is_id","type":"string","description":"","default":"DOUANE_AGENCE_GONDRAND"}],'
            '"optional_parameters":[],"response_template":"\\"str\\""}\n\n'
            'Examples:\nRequest: {"is_id":"DOUANE_AGENCE_GONDRAND"}\n'
            'Response: {"error":"","response":"Gondrand, Nouméa"}'
            '\n\nRequest:\n{"is_id":"EKVF"}',
        },
    ]


def test_mirrorapi_v2_writes_json_responses_as_values(registry):
    """v1's layout; an example whose response text holds a JSON object or array shows it as that value, unescaped;
    other text (plain, a Python repr, broken JSON) stays a string."""
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    examples = [
        ({"is_id": "A"}, {"error": "", "response": '{"id": "A", "tags": ["x"]}'}),
        ({"is_id": "B"}, {"error": "", "response": "[1, 2]"}),
        ({"is_id": "C"}, {"error": "", "response": "{'id': 'C'}"}),
        ({"is_id": "D"}, {"error": "Not found", "response": '{"id": '}),
    ]
    v1 = simulator_messages(doc, {"is_id": "EKVF"}, examples)
    v2 = simulator_messages(doc, {"is_id": "EKVF"}, examples, fmt="mirrorapi-v2")
    assert v2[0] == {"role": "system", "content": MIRRORAPI_V1_SYSTEM}
    shots_v1 = v1[1]["content"].split("Examples:\n")[1].split("\n\nRequest:")[0]
    shots_v2 = v2[1]["content"].split("Examples:\n")[1].split("\n\nRequest:")[0]
    assert v2[1]["content"].replace(shots_v2, shots_v1) == v1[1]["content"]  # only the examples differ
    assert shots_v2 == (
        'Request: {"is_id":"A"}\nResponse: {"error":"","response":{"id":"A","tags":["x"]}}\n'
        'Request: {"is_id":"B"}\nResponse: {"error":"","response":[1,2]}\n'
        'Request: {"is_id":"C"}\nResponse: {"error":"","response":"{\'id\': \'C\'}"}\n'
        'Request: {"is_id":"D"}\nResponse: {"error":"Not found","response":"{\\"id\\": "}'
    )


def test_mirrorapi_session_v2_writes_json_responses_as_values_in_examples_and_history(registry):
    """`mirrorapi-session-v1`'s layout and system prompt; the examples and the earlier calls' answers as
    `mirrorapi-v2` writes responses (a JSON object or array as that value); only those two parts differ."""
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    examples = [({"is_id": "A"}, {"error": "", "response": '{"id": "A", "tags": ["x"]}'})]
    real = ("transitaires", "transitaires", {"is_id": "A"}, "", '{"id": "A", "tags": ["x"]}')
    earlier_v1, earlier_v2 = history_line(*real), history_line(*real, fmt="mirrorapi-session-v2")
    assert earlier_v2 == (
        '{"tool":"transitaires","api":"transitaires","request":{"is_id":"A"},'
        '"answer":{"error":"","response":{"id":"A","tags":["x"]}}}'
    )
    v1 = simulator_messages(doc, {"is_id": "EKVF"}, examples, fmt="mirrorapi-session-v1", history=[earlier_v1])
    v2 = simulator_messages(doc, {"is_id": "EKVF"}, examples, fmt="mirrorapi-session-v2", history=[earlier_v2])
    assert v2[0] == v1[0]
    assert (
        "\n\nEarlier calls in this session, newest first:\n" + earlier_v2 + '\n\nRequest:\n{"is_id":"EKVF"}'
        in v2[1]["content"]
    )
    assert (
        'Examples:\nRequest: {"is_id":"A"}\nResponse: {"error":"","response":{"id":"A","tags":["x"]}}\n\n'
        in v2[1]["content"]
    )
    assert (
        v2[1]["content"].replace('{"id":"A","tags":["x"]}', '"{\\"id\\": \\"A\\", \\"tags\\": [\\"x\\"]}"')
        == v1[1]["content"]
    )


FAC_V1_SYSTEM = (
    "You decide whether an AI assistant's final answer solves a user's query. Judge the final answer "
    "alone and do not check its facts against your own knowledge.\n"
    "Solved: the answer genuinely addresses every part of the query and gives what was asked for; after "
    "reasonable attempts, reporting that nothing could be found also counts.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, an answer that leaves a part of "
    "the query unaddressed, or an answer about something else.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved or Unsolved\n"
    "Reason: one short sentence"
)

SOPR_V1_SYSTEM = (
    "You decide whether an AI assistant solved a user's query, from the tool calls it made and its final "
    "answer. Do not check facts against your own knowledge.\n"
    "Solved: the final answer addresses every part of the query and agrees with the tool results.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, a part of the query left "
    "unaddressed, an answer that contradicts the tool results, or tool calls that all failed.\n"
    "Unsure: the answer looks complete, but the tool results neither confirm nor contradict it.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved, Unsolved or Unsure\n"
    "Reason: one short sentence"
)


def test_fac_v1():
    assert judge_messages("  Recommend a horror movie.\n", "The Conjuring (2013).", "fac-v1") == [
        {"role": "system", "content": FAC_V1_SYSTEM},
        {"role": "user", "content": "Query:\nRecommend a horror movie.\n\nFinal answer:\nThe Conjuring (2013)."},
    ]
    long = judge_messages("q", "x" * 8001, "fac-v1")[1]["content"]
    assert long == "Query:\nq\n\nFinal answer:\n" + "x" * 8000 + "..."


def test_sopr_v1():
    steps = '- search_movies({"genre": "horror"}) -> {"results": ["The Conjuring"]}'
    assert judge_messages("Recommend a horror movie.", "The Conjuring.", "sopr-v1", steps=steps) == [
        {"role": "system", "content": SOPR_V1_SYSTEM},
        {
            "role": "user",
            "content": "Query:\nRecommend a horror movie.\n\nTool calls:\n"
            + steps
            + "\n\nFinal answer:\nThe Conjuring.",
        },
    ]
    assert judge_messages("q", "a", "sopr-v1")[1]["content"] == "Query:\nq\n\nTool calls:\n(none)\n\nFinal answer:\na"


def test_mirrorapi_session_v1(registry):
    # `mirrorapi-v1` plus the session paragraph of the system prompt, and, between the examples and the
    # request, the earlier calls newest first, one compact `{"tool","api","request","answer"}` line each.
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    earlier = history_line("transitaires", "transitaires", {}, "", "DOUANE_AGENCE_GONDRAND, EKVF")
    assert earlier == (
        '{"tool":"transitaires","api":"transitaires","request":{},'
        '"answer":{"error":"","response":"DOUANE_AGENCE_GONDRAND, EKVF"}}'
    )
    system, user = simulator_messages(doc, {"is_id": "EKVF"}, fmt="mirrorapi-session-v1", history=[earlier])
    assert system == {
        "role": "system",
        "content": MIRRORAPI_V1_SYSTEM
        + (
            " The request is part of a session: the session's earlier calls and their answers are listed, newest "
            "first. Stay consistent with them: what they created (ids, tokens, names, bookings) exists, what they "
            "deleted does not, and values they returned keep their values."
        ),
    }
    doc_json = user["content"].split("\n\n")[0]
    assert user["content"] == (
        doc_json + "\n\nEarlier calls in this session, newest first:\n" + earlier + '\n\nRequest:\n{"is_id":"EKVF"}'
    )
    assert doc_json == simulator_messages(doc, {})[1]["content"].split("\n\n")[0]  # the mirrorapi-v1 doc
    first = simulator_messages(doc, {"is_id": "EKVF"}, fmt="mirrorapi-session-v1", history=[])[1]["content"]
    assert "\n\nEarlier calls in this session, newest first:\n(none)\n\nRequest:\n" in first
