"""Prompt formats and the parsers of model output."""

import json

import pytest

from mirrorapi.prompts.judge_formats import (
    FAC_SYSTEM_V1,
    SOPR_SYSTEM_V1,
    judge_completion,
    judge_messages,
    parse_verdict,
)
from mirrorapi.prompts.simulator_formats import RESPONSE_CHAR_BUDGET, simulator_messages, truncate_response
from mirrorapi.prompts.simulator_output import is_strict_observation, parse_simulator_output
from mirrorapi.records import canonical_json, observation_json, parse_repr_key
from mirrorapi.tools import ToolRegistry


@pytest.fixture(scope="module")
def registry(samples):
    return ToolRegistry.load([samples / "tools"])


def test_canonical_json_and_stabletoolbench_repr_keys():
    assert canonical_json({"b": 2, "a": "é"}) == '{"a":"é","b":2}'
    # A StableToolBench cache key is str(dict): single quotes, True/None, insertion order.
    assert canonical_json(parse_repr_key("{'name': 'Lionel Messi', 'top': True, 'x': None}")) == canonical_json(
        {"x": None, "top": True, "name": "Lionel Messi"}
    )
    assert parse_repr_key("{}") == {}
    with pytest.raises(ValueError):
        parse_repr_key("{'unterminated")


def test_mirrorapi_v1_messages(registry):
    doc = registry.resolve("TauBench", "taubench_airline", "get_user_details")
    messages = simulator_messages(
        doc,
        {"user_id": "mia_li_3668"},
        examples=[({"user_id": "x"}, {"error": "Error: user not found", "response": ""})],
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    doc_json = json.loads(user.split("\n", 1)[1].split("\n\n", 1)[0])
    assert doc_json["api"] == "get_user_details" and doc_json["required_parameters"][0]["name"] == "user_id"
    assert user.endswith('Request:\n{"user_id":"mia_li_3668"}')
    assert 'Response: {"error":"Error: user not found","response":""}' in user
    # Same call, keys in another order: the same prompt (the request is canonical JSON).
    again = simulator_messages(doc, {"user_id": "mia_li_3668"})
    assert again[1]["content"].endswith(user.rsplit("\n\n", 1)[1])


def test_mirrorapi_v1_uses_wire_parameter_names(registry):
    doc = registry.resolve("Logistics", "transitaires", "transitaire")
    user = simulator_messages(doc, {"is_id": "EKVF"})[1]["content"]
    assert '"name":"is_id"' in user  # the doc says `id`; agents send `is_id`


def test_stabletoolbench_layout(registry):
    doc = registry.resolve("Artificial_Intelligence_Machine_Learning", "ttskraken", "list_languages")
    with pytest.raises(ValueError, match="system prompt"):
        simulator_messages(doc, {}, fmt="stabletoolbench")
    system, user = simulator_messages(doc, {"toolbench_key": "k"}, fmt="stabletoolbench", system_prompt="SYS")
    assert system == {"role": "system", "content": "SYS"}
    head, request = user["content"].split("\n\nRequest:\n")
    assert head.startswith("API doc:\n{'api_name': 'List Languages', 'api_description': ")
    assert head.endswith("'tool_name': 'ttskraken', 'tool_category': 'Artificial_Intelligence_Machine_Learning'}")
    assert request == "{}"  # toolbench_key removed, no trailing newline
    cache_fmt = simulator_messages(doc, {}, fmt="stabletoolbench-cache", system_prompt="SYS")[1]["content"]
    assert cache_fmt.startswith("API doc:\n{'api_name': 'list_languages'")


def _observations(shared_data):
    # Observations StableToolBench's agents received from its virtual server (json.dumps of the reply).
    for path in (shared_data / "stabletoolbench/data_example/answer").glob("*/G1_instruction/*.json"):
        answer = json.loads(path.read_text())
        stack = [answer.get("tree", {}).get("tree")] + [n for t in answer.get("trys", []) for n in t["chain"]]
        while stack:
            node = stack.pop()
            if not node:
                continue
            stack.extend(node.get("children", []))
            if node.get("observation") and node.get("node_type") == "Action Input":
                yield node["observation"]


def test_parses_real_stabletoolbench_observations(shared_data):
    whole = cut = 0
    for text in _observations(shared_data):
        obs, how = parse_simulator_output(text)
        try:
            expected = json.loads(text)
        except ValueError:
            # The client cut the observation at 1,024 characters + "...": the prefix is still read.
            assert text.endswith("...") and how in ("regex", "repaired") and obs["error"] == ""
            assert isinstance(obs["response"], (str, dict, list)) and len(str(obs["response"])) > 100
            cut += 1
            continue
        if "error" not in expected:  # the client's own Finish messages, not server replies
            continue
        assert how == "json" and obs == {"error": expected["error"], "response": expected.get("response", "")}
        whole += 1
    assert whole >= 20 and cut >= 1


@pytest.mark.parametrize(
    "text, expected, how",
    [
        ('{"error": "", "response": {"a": 1}}', {"error": "", "response": {"a": 1}}, "json"),
        ('{"error": "", "response": ""}', {"error": "", "response": ""}, "json"),  # empty is a valid answer
        ('```json\n{"error": "", "response": "ok"}\n```', {"error": "", "response": "ok"}, "fenced"),
        (
            "{'error': '', 'response': 'single quotes', 'x': True}",
            {"error": "", "response": "single quotes"},
            "literal",
        ),
        (
            '{"mechanism_of_the_api": "it looks up "things"", "error": "", "response": "He said "hi" today"}',
            {"error": "", "response": 'He said "hi" today'},
            "regex",
        ),
        ('{"error": "", "response": {"list": [1, 2', {"error": "", "response": {"list": [1, 2]}}, "repaired"),
        ('{"error": null, "response": [1]}', {"error": "", "response": [1]}, "json"),
        # Half an emoji's escape pair (a lone surrogate, which UTF-8 cannot hold): U+FFFD in its place; a whole
        # pair, as JSON and as a Python literal (which leaves the two halves apart), is the emoji.
        (
            '{"error": "", "response": {"\\ud83d": "Messi \\ud83d"}}',
            {"error": "", "response": {"\ufffd": "Messi \ufffd"}},
            "json",
        ),
        ('{"error": "", "response": "\\ud83d\\ude00"}', {"error": "", "response": "\U0001f600"}, "json"),
        (
            "{'error': '\\udc00', 'response': ['\\ud83d\\ude00']}",
            {"error": "\ufffd", "response": ["\U0001f600"]},
            "literal",
        ),
        # NaN and Infinity, which Python's json reads and RFC 8259 has not (a strict client cannot parse a body
        # holding one): null. A literal's tuple is a list.
        (
            '{"error": "", "response": {"price": NaN, "max": -Infinity, "big": 1e400}}',
            {"error": "", "response": {"price": None, "max": None, "big": None}},
            "json",
        ),
        ("{'error': '', 'response': (1, 2)}", {"error": "", "response": [1, 2]}, "literal"),
    ],
)
def test_parse_simulator_output_variants(text, expected, how):
    assert parse_simulator_output(text) == (expected, how)


@pytest.mark.parametrize("levels", [300, 500, 999, 5000])
def test_an_answer_nested_past_what_the_parser_walks_is_unparseable_text(levels):
    """A model's answer nested hundreds deep: the parser reads it (or not), and no RecursionError leaves it."""
    for inner in ("[" * levels + "]" * levels, '{"a": ' * levels + "1" + "}" * levels):
        obs, how = parse_simulator_output('{"error": "", "response": ' + inner + "}")
        if levels < 500:
            assert how == "json" and obs is not None
        else:
            assert (obs, how) == (None, "failed")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ATATATAT",
        "[1, 2]",
        '{"answer": 1}',
        "<|im_end|>",
        # What a looping or confused model writes, once a traceback and an internal error on /virtual: a literal
        # JSON cannot hold (a set, bytes), a raw control character in the error, nesting past the recursion limit.
        "{'error': '', 'response': {1, 2}}",
        "{'error': '', 'response': b'x'}",
        '"error": "a\x01b", "response": "r"',
        '{"error": "", "response": ' + "[" * 100_000,
    ],
)
def test_parse_simulator_output_rejects_garbage(text):
    assert parse_simulator_output(text) == (None, "failed")


def test_strict_observation_and_truncation():
    assert is_strict_observation(observation_json("", "x"))
    assert not is_strict_observation('{"response": "x"}')
    assert not is_strict_observation("```json\n{}\n```")
    long = "x" * (RESPONSE_CHAR_BUDGET + 10)
    assert truncate_response(long) == "x" * RESPONSE_CHAR_BUDGET + "..."
    assert truncate_response({"k": long}) == {"k": long}


@pytest.mark.parametrize(
    "text, verdict, reason",
    [
        (
            "Verdict: Solved\nReason: Lists three movies; nothing is unsolved.",
            "Solved",
            "Lists three movies; nothing is unsolved.",
        ),
        ("**Verdict:** Unsolved\n**Reason:** It apologises.", "Unsolved", "It apologises."),
        # StableToolBench's FAC judge output format (notes §5.5).
        (
            "Answer Status\nUnsolved\nReason\nThe answer does not give the lyrics.",
            "Unsolved",
            "The answer does not give the lyrics.",
        ),
        ("Solved", "Solved", ""),
        ("The answer seems solved but maybe unsolved", None, ""),
        ("Verdict: Unsure\nReason: can't tell", None, "can't tell"),
    ],
)
def test_parse_verdict(text, verdict, reason):
    assert parse_verdict(text) == (verdict, reason)


def test_parse_verdict_allows_unsure_for_sopr():
    assert parse_verdict("Verdict: Unsure", allowed=("Solved", "Unsolved", "Unsure"))[0] == "Unsure"


@pytest.mark.parametrize("system", [FAC_SYSTEM_V1, SOPR_SYSTEM_V1])
def test_the_prompts_format_line_echoed_back_is_no_verdict(system):
    # A small judge often writes the format line it was shown ("Verdict: Solved or Unsolved"): that names
    # every verdict, so it is unparseable, not the first one named.
    format_line = next(line for line in system.splitlines() if line.startswith("Verdict:"))
    assert " or " in format_line
    everything = ("Solved", "Unsolved", "Unsure")
    assert parse_verdict(format_line, allowed=everything) == (None, "")
    assert parse_verdict(f"**{format_line}**\nReason: one short sentence", allowed=everything)[0] is None
    assert parse_verdict("Verdict: Solved/Unsolved")[0] is None
    # A verdict whose reason names the other one stays a verdict.
    assert parse_verdict("Verdict: Solved\nReason: nothing is left unsolved")[0] == "Solved"


def test_judge_messages_round_trip():
    messages = judge_messages("Find a song", "Here is one: X")
    assert messages[1]["content"] == "Query:\nFind a song\n\nFinal answer:\nHere is one: X"
    assert parse_verdict(judge_completion("Unsolved", "off-topic")) == ("Unsolved", "off-topic")
