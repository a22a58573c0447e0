"""Toolsets and their function schemas (issue 13): `mirrorapi tools export --format openai|mcp`, and
OpenAI function files that load back into the registry as the same functions."""

import json

import pytest

from mirrorapi.cli import main
from mirrorapi.tools import ToolRegistry
from mirrorapi.toolsets import ToolsetError, input_schema, select_toolset


def export(tmp_path, name: str, *argv: str) -> list[dict]:
    out = tmp_path / name
    assert main(["tools", "export", *argv, "--out", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_openai_export_loads_back_as_the_same_functions(samples, tmp_path):
    first = export(tmp_path, "functions.json", "--tools", str(samples / "tools"))
    assert len(first) == ToolRegistry.load([samples / "tools"]).stats()["apis"]
    again = export(tmp_path, "again.json", "--tools", str(tmp_path / "functions.json"))
    by_name = {f["function"]["name"]: f for f in first}
    assert len(by_name) == len(first) and {f["function"]["name"]: f for f in again} == by_name
    # Two tools with an API of the same name are told apart with ToolBench's <api>_for_<tool>.
    names = {f["function"]["name"] for f in first}
    assert {"addmeeting_for_apibank_meeting", "addmeeting_for_apibank_lv3_meeting", "getusertoken"} <= names


def test_schema_from_a_rapidapi_doc(samples):
    # data/samples/tools/Sports/live_sports_odds.json, "/v4/sports/{sport}/odds"
    doc = ToolRegistry.load([samples / "tools"]).resolve("Sports", "live_sports_odds", "/v4/sports/{sport}/odds")
    schema = input_schema(doc)
    assert schema["required"] == ["sport", "regions"]
    assert schema["properties"]["regions"] == {
        "type": "string",
        "default": "us",
        "description": doc.required_parameters[1]["description"],
    }
    assert schema["properties"]["oddsformat"]["default"] == "decimal"  # wire names, as agents send them


def test_toolsets_by_category_tool_api_and_query(samples):
    query_file = samples / "stabletoolbench/solvable_queries_example/test_instruction/G1_instruction.json"
    registry = ToolRegistry.load([samples / "tools", query_file])
    queries = json.loads(query_file.read_text(encoding="utf-8"))
    chosen = select_toolset(registry, f"query={queries[0]['query_id']}").functions
    assert {(d.tool_title, d.api_title) for d in chosen.values()} == {
        (a["tool_name"], a["api_name"]) for a in queries[0]["api_list"]
    }
    mixed = select_toolset(
        registry, "category=Sports&tool=APIBank/apibank_account&api=Data/theclique/Songkick concert"
    )
    assert {d.category for d in mixed.functions.values()} == {"Sports", "APIBank", "Data"}
    assert select_toolset(registry, "").functions.keys() >= mixed.functions.keys()
    for spec, message in (
        ("tools=Data", "unknown toolset key 'tools'"),
        ("tool=Data", "expected <Category>/<tool>"),
        ("query=nope", "unknown query 'nope'"),
        ("tool=Data/nope", "Unknown tool 'nope'"),
    ):
        with pytest.raises(ToolsetError, match=message):
            select_toolset(registry, spec)


def test_export_of_an_unknown_name_is_one_line(samples, capsys):
    assert main(["tools", "export", "--tools", str(samples / "tools"), "--category", "Nope"]) == 2
    assert capsys.readouterr().err.strip() == "mirrorapi: error: Unknown category 'Nope'."
