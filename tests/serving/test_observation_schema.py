"""Structured output per API in `mirrorapi-v2`: a success must answer the documented response shape, an error
anything, an in-band error the form tau-bench's tools write (`"Error: ..."`, its recorded answers); v1 and
undocumented APIs keep the plain
observation schema. The expected verdicts are written from the doc templates below, and the schema must compile
into llama.cpp's grammar (the CPU engine) as it is sent."""

import json

import jsonschema
import pytest

from mirrorapi.llama_cpp_engine import ANY_JSON, explicit_any
from mirrorapi.prompts.simulator_formats import OBSERVATION_SCHEMA, observation_schema
from mirrorapi.tools import ApiDoc


def doc(template):
    return ApiDoc(
        category="TauBench",
        tool="taubench_airline",
        api="get_user_details",
        tool_title="t",
        api_title="a",
        tool_description="",
        description="",
        method="GET",
        required_parameters=[],
        optional_parameters=[],
        template_response=template,
    )


USER = {"name": {"first_name": "str", "last_name": "str"}, "email": "str", "_list_length": 1}


@pytest.mark.parametrize(
    "answer, valid",
    [
        ({"error": "", "response": {"name": {"first_name": "Mia", "last_name": "Li"}, "email": "m@x"}}, True),
        ({"error": "", "response": {"name": {"first_name": "Mia", "last_name": "Li"}, "email": "m@x", "x": 1}}, True),
        ({"error": "", "response": "success"}, False),  # a success must be the documented object
        ({"error": "", "response": {"email": "m@x"}}, False),  # a documented key is missing
        # tau-bench's in-band failures, as its recorded answers write them (../shared/data/pairs/tau-bench.jsonl)
        ({"error": "", "response": "Error: payment amount does not add up, total price is 375, but paid 29"}, True),
        ({"error": "", "response": "Error: flight HAT030 not available on date 2024-05-13"}, True),
        ({"error": "", "response": "Errores"}, False),  # a success's plain string does not escape into the branch
        ({"error": "", "response": "Error:"}, False),
        ({"error": "Unknown user", "response": ""}, True),
        (
            {"error": "", "response": {"name": {"first_name": "Mia", "last_name": "Li"}, "email": "m@x"}, "more": 1},
            False,
        ),
    ],
)
def test_v2_success_has_the_documented_shape(answer, valid):
    schema = observation_schema(doc(USER), "mirrorapi-v2")
    assert jsonschema.validators.validator_for(schema)(schema).is_valid(answer) is valid


def test_v1_and_undocumented_apis_keep_the_observation_schema():
    assert observation_schema(doc(USER), "mirrorapi-v1") is OBSERVATION_SCHEMA
    assert observation_schema(doc("str"), "mirrorapi-v2") is OBSERVATION_SCHEMA
    assert observation_schema(doc(None), "mirrorapi-v2") is OBSERVATION_SCHEMA


def test_the_schema_compiles_into_a_llama_cpp_grammar():
    pytest.importorskip("llama_cpp")  # the CPU engine's own converter (make engine)
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    for template in (USER, [{"flight_number": "str", "price": "int", "_list_length": 2}]):
        schema = explicit_any(observation_schema(doc(template), "mirrorapi-v2"))
        assert "{}" not in json.dumps(schema)  # every "any value" spelt out, as the engine needs it
        LlamaGrammar.from_string(json_schema_to_gbnf(json.dumps(schema)), verbose=False)


def test_a_sub_schema_of_annotations_alone_is_spelt_out_as_any_value():
    # A doc's schema often describes a property without typing it (`{"description": "The teams", "format":
    # "jsonb"}`, ToolEnv2404's american_football_devs): any value, like `{}`. llama-cpp-python's converter refuses
    # it and then enforces no schema at all (its grammar for any JSON), so it is spelt out before it is sent.
    schema = {
        "type": "object",
        "properties": {"teams": {"description": "The teams", "format": "jsonb"}, "n": {"type": "integer"}},
        "items": {"title": "t"},
        "anyOf": [{}, {"type": "string", "description": "d"}],
    }
    rewritten = explicit_any(schema)
    assert rewritten["properties"] == {"teams": ANY_JSON, "n": {"type": "integer"}}
    assert rewritten["items"] == ANY_JSON and rewritten["anyOf"] == [ANY_JSON, {"type": "string", "description": "d"}]


def test_any_value_is_spelt_out_under_definitions_all_of_and_item_lists_too():
    # ToolEnv2404's gptizer_enterprise documents `{"description": "**Omitted**"}` under `allOf`; `$defs`,
    # `definitions` and `prefixItems`/list `items` hold sub-schemas the same way (JSON Schema 2020-12, draft-06).
    schema = {
        "allOf": [{"description": "**Omitted**"}, {"type": "object"}],
        "$defs": {"a": {"title": "A"}},
        "definitions": {"b": {}},
        "prefixItems": [{"description": "first"}],
        "items": [{"type": "string"}, {}],
    }
    rewritten = explicit_any(schema)
    assert rewritten["allOf"] == [ANY_JSON, {"type": "object"}]
    assert rewritten["$defs"] == {"a": ANY_JSON} and rewritten["definitions"] == {"b": ANY_JSON}
    assert rewritten["prefixItems"] == [ANY_JSON] and rewritten["items"] == [{"type": "string"}, ANY_JSON]


def test_a_response_schema_the_engine_cannot_compile_keeps_the_envelope_enforced():
    """ToolEnv2404's lemurbot `list_all_bots` documents a `pattern` without `^...$`, which llama-cpp-python's
    converter refuses; it then enforces "any JSON" without a word, the `{"error", "response"}` envelope included.
    The engine is given the observation with its `response` any value instead."""
    pytest.importorskip("llama_cpp")  # the CPU engine's own converter (make engine)
    from llama_cpp import llama_chat_format, llama_grammar

    from mirrorapi.llama_cpp_engine import openai_request

    documented = {"type": "object", "properties": {"id": {"type": "string", "pattern": "[a-z0-9]{24}"}}}
    schema = observation_schema(doc({"id": "str"}), "mirrorapi-v2")
    success = schema["anyOf"][0]
    schema["anyOf"][0] = {**success, "properties": {**success["properties"], "response": documented}}
    body = json.dumps({"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}})
    sent = json.loads(openai_request(body.encode()))["response_format"]["schema"]
    assert [branch["properties"]["response"] for branch in sent["anyOf"]] == [ANY_JSON] * 3
    assert [branch["properties"]["error"] for branch in sent["anyOf"]] == [
        branch["properties"]["error"] for branch in schema["anyOf"]
    ]
    sent = {"type": "json_object", "schema": sent}
    any_json = llama_grammar.LlamaGrammar.from_string(llama_grammar.JSON_GBNF, verbose=False)._grammar
    assert llama_chat_format._grammar_for_response_format(sent)._grammar != any_json


def test_every_sample_api_s_response_format_is_enforced_by_llama_cpp(samples):
    pytest.importorskip("llama_cpp")  # the CPU engine's own converter (make engine)
    from llama_cpp import llama_chat_format, llama_grammar

    from mirrorapi.llama_cpp_engine import openai_request
    from mirrorapi.serving.simulator import response_format
    from mirrorapi.tools import ToolRegistry

    any_json = llama_grammar.LlamaGrammar.from_string(llama_grammar.JSON_GBNF, verbose=False)._grammar
    registry = ToolRegistry.load([samples / "tools"])
    docs = [d for tools in registry.categories.values() for tool in tools.values() for d in tool.apis.values()]
    fallen_back = []
    for api in docs:
        body = json.dumps({"response_format": response_format(api, "mirrorapi-v2")}).encode()
        sent = json.loads(openai_request(body))["response_format"]
        if llama_chat_format._grammar_for_response_format(sent)._grammar == any_json:  # its silent fallback
            fallen_back.append(api.api)
    assert len(docs) > 200 and fallen_back == []


def test_a_doc_schema_s_references_still_resolve_once_nested_in_the_observation():
    # ToolEnv2404's corunacommunity `listar_eventos` documents its response so: items by `#/definitions/...`, a
    # reference from the root of the document it is in, which nesting it under `response` would leave dangling.
    event = {"type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"}}}
    documented = {
        "$schema": "http://json-schema.org/draft-06/schema#",
        "type": "array",
        "items": {"$ref": "#/definitions/EventElement"},
        "definitions": {"EventElement": {**event, "required": ["id", "name"]}},
    }
    api = doc(None)
    api.response_schema = documented
    schema = observation_schema(api, "mirrorapi-v2")
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert validator.is_valid({"error": "", "response": [{"id": "1", "name": "Meetup"}]})
    assert not validator.is_valid({"error": "", "response": [{"id": "1"}]})  # EventElement's `name` is required
