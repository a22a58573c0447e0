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


def test_an_api_whose_title_holds_a_slash_is_named_by_its_title(samples, tmp_path):
    """`api=Logistics/trackingmore_v2/packages/v2/track` was split at every "/" and refused as not
    <Category>/<tool>/<api>; the title is the rest after the second "/" (category and tool names hold none)."""
    registry = ToolRegistry.load([samples / "tools"])
    named = [("packages/v2/track",) * 2, ("carriers/detect",) * 2, ("packages_v2_track", "packages/v2/track")]
    for given, title in named:
        chosen = select_toolset(registry, f"api=Logistics/trackingmore_v2/{given}").functions
        assert [d.api_title for d in chosen.values()] == [title]
    spec = ["--api", "Data/theclique/List Artist Albums/Singles/Compilations"]
    (exported,) = export(tmp_path, "one.json", "--tools", str(samples / "tools"), *spec)
    assert exported["function"]["name"] == "list_artist_albums_singles_compilations"
    with pytest.raises(ToolsetError, match="expected <Category>/<tool>"):
        select_toolset(registry, "tool=Logistics/trackingmore_v2/extra")


def test_export_of_an_unknown_name_is_one_line(samples, capsys, tmp_path):
    assert main(["tools", "export", "--tools", str(samples / "tools"), "--category", "Nope"]) == 2
    assert capsys.readouterr().err.strip() == "mirrorapi tools export: error: Unknown category 'Nope'."
    # an --out in a folder that does not exist: one line (it was open()'s traceback)
    out = tmp_path / "missing" / "tools.json"
    assert main(["tools", "export", "--tools", str(samples / "tools"), "--category", "Data", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"mirrorapi tools export: error: cannot write --out {out}: No such file or directory"
    )


@pytest.mark.shared
def test_schemas_of_real_docs_are_valid_json_schemas_that_function_callers_take(shared_data, tmp_path):
    """Two ToolEnv2404 docs as they are: getCVEBySeverity lists its `severity` parameter twice (JSON Schema 2020-12
    §6.5.3: `required`'s elements MUST be unique, and the MCP spec wants a valid schema as `inputSchema`), and
    reqres' user_by_id has an ARRAY parameter with the default "2" (an array's default should be an array; and
    OpenAI's function calling refuses an array schema without `items`). And docs whose defaults are not strings of
    the parameter's type: a NUMBER's default [] or ["100"] (zeento_cloud, which_postcode), a BOOLEAN's 0 and
    [false] (aliexpress_unofficial, copa_america), exported as they were (63 in ToolEnv2404)."""
    import jsonschema

    for category, file in (
        ("Business_Software", "common_vulnerabilities_and_exposures_cve.json"),
        ("Advertising", "reqres_dont_change.json"),
        ("Business", "zeento_cloud.json"),
        ("Location", "which_postcode.json"),
        ("Commerce", "aliexpress_unofficial.json"),
        ("Sports", "copa_america.json"),
    ):
        (tmp_path / category).mkdir()
        (tmp_path / category / file).write_bytes((shared_data / "toolenv/toolenv2404" / category / file).read_bytes())
    registry = ToolRegistry.load([tmp_path])
    defaults = 0
    for doc in registry:
        schema = input_schema(doc)
        jsonschema.Draft202012Validator.check_schema(schema)
        for name, item in schema["properties"].items():
            assert item["type"] != "array" or "items" in item, (doc.api, name)
            if "default" in item:
                defaults += 1
                assert jsonschema.Draft202012Validator(item).is_valid(item["default"]), (doc.api, name, item)
    assert defaults > 20  # the converted ones are kept: not every default dropped
    cve = input_schema(
        registry.resolve("Business_Software", "common_vulnerabilities_and_exposures_cve", "getCVEBySeverity")
    )
    assert cve["required"] == ["severity"]
    users = input_schema(registry.resolve("Advertising", "reqres_dont_change", "user_by_id"))
    assert users["properties"]["array"] == {"type": "array", "items": {}}


def test_a_toolset_spec_names_each_item_once_and_a_bounded_number_of_them(samples):
    """A URL's query string repeating `category=` a thousand times took the server 28 s (the category looked up once
    per API, per item): an item named twice is one, and a spec names at most MAX_TOOLSET_ITEMS."""
    from mirrorapi.toolsets import MAX_TOOLSET_ITEMS, ToolsetCache

    registry = ToolRegistry.load([samples / "tools"])
    once = select_toolset(registry, "category=Sports")
    assert select_toolset(registry, "&".join(["category=Sports"] * 1000)).functions == once.functions
    many = "&".join(f"api=APIBank/apibank_account/GetUserToken{i}" for i in range(MAX_TOOLSET_ITEMS + 1))
    with pytest.raises(ToolsetError, match=f"toolset names at most {MAX_TOOLSET_ITEMS}"):
        select_toolset(registry, many)
    # The toolsets used last are kept (it kept the first ones it saw, and built every later spec on each use).
    cache = ToolsetCache(registry, limit=2)
    first = cache.get("category=Sports")
    cache.get("tool=APIBank/apibank_account")
    cache.get("tool=APIBank/apibank_finance")
    assert cache.get("tool=APIBank/apibank_finance") is cache.get("tool=APIBank/apibank_finance")
    assert cache.get("category=Sports") is not first  # the least recently used was let go


@pytest.mark.parametrize("spec", ["foo", "category=", "tool=APIBank/apibank_account&api="])
def test_a_toolset_item_without_a_value_is_refused_not_every_api(samples, spec):
    """`--toolset foo` (no `=`) and `category=` were dropped as blank, leaving the empty toolset: every API."""
    with pytest.raises(ToolsetError):
        select_toolset(ToolRegistry.load([samples / "tools"]), spec)


def test_exported_names_are_names_openai_takes(tmp_path):
    """OpenAI's function names are `^[a-zA-Z0-9_-]{1,64}$` (its function-calling reference); a tool file whose stem
    held a dot (`weather.v2.json`, a name ToolBench-style folders may hold) was exported as `search_for_weather.v2`."""
    import re

    (tmp_path / "tools" / "Weather").mkdir(parents=True)
    for stem, title in (("weather.v2", "Weather v2"), ("mapper", "Mapper")):
        tool = {"tool_name": title, "api_list": [{"name": "search", "required_parameters": []}]}
        (tmp_path / "tools" / "Weather" / f"{stem}.json").write_text(json.dumps(tool))
    for fmt in ("openai", "mcp"):
        exported = export(tmp_path, f"{fmt}.json", "--tools", str(tmp_path / "tools"), "--format", fmt)
        names = [f["function"]["name"] if fmt == "openai" else f["name"] for f in exported]
        assert len(names) == 2 and len(set(names)) == 2
        assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in names), names


def test_the_toolset_cache_is_keyed_by_what_a_spec_names_and_bounded_by_functions(samples):
    """A client's spellings of one toolset (`%63ategory=Sports`, an item twice, another order) were each a toolset
    made and kept (a spec of every ToolEnv2404 category: ~3.3 MB and 0.3 s of the event loop each, 1,024 kept);
    a reset's toolset past the episode's limit was made and kept before it was refused."""
    from mirrorapi.toolsets import ToolsetCache, TooManyFunctions

    registry = ToolRegistry.load([samples / "tools"])
    cache = ToolsetCache(registry)
    first = cache.get("category=Sports&tool=APIBank/apibank_account")
    for spelt in (
        "%63ategory=Sports&tool=APIBank%2Fapibank_account",
        "tool=APIBank/apibank_account&category=Sports",
        "category=Sports&category=Sports&tool=APIBank/apibank_account",
    ):
        assert cache.get(spelt) is first
    assert len(cache._toolsets) == 1
    everything = len(select_toolset(registry, "").functions)
    with pytest.raises(TooManyFunctions, match=f"it names {everything:,} APIs, more than 10"):
        cache.get("", max_functions=10)
    assert len(cache._toolsets) == 1  # counted, not kept
    small = ToolsetCache(registry, functions_limit=everything)
    for spec in ("category=Sports", "tool=APIBank/apibank_account", ""):
        small.get(spec)
    assert list(small._toolsets) == [()] and small._functions == everything  # the rest forgotten to make room


def test_defaults_json_cannot_hold_are_dropped_not_a_crash_or_nan(tmp_path):
    """A doc's INTEGER default "1e400" crashed the export (OverflowError: float infinity to integer), a NUMBER's "nan"
    was written as NaN (RFC 8259 has no NaN: a strict reader refuses the file), an INTEGER's "1.5" became 1."""
    (tmp_path / "tools" / "Data").mkdir(parents=True)
    parameters = [
        {"name": name, "type": json_type, "description": "", "default": default}
        for name, json_type, default in (
            ("huge", "INTEGER", "1e400"),
            ("ratio", "NUMBER", "nan"),
            ("low", "NUMBER", "-inf"),
            ("half", "INTEGER", "1.5"),
            ("count", "INTEGER", "10.0"),
            ("scale", "NUMBER", "2.5"),
        )
    ]
    tool = {
        "tool_name": "Nanny",
        "api_list": [{"name": "measure", "required_parameters": [], "optional_parameters": parameters}],
    }
    (tmp_path / "tools" / "Data" / "nanny.json").write_text(json.dumps(tool))
    out = tmp_path / "functions.json"
    assert main(["tools", "export", "--tools", str(tmp_path / "tools"), "--out", str(out)]) == 0

    def refuse(constant: str):
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    [function] = json.loads(out.read_text(encoding="utf-8"), parse_constant=refuse)
    properties = function["function"]["parameters"]["properties"]
    assert {name: item.get("default") for name, item in properties.items()} == {
        "huge": None,
        "ratio": None,
        "low": None,
        "half": None,
        "count": 10,
        "scale": 2.5,
    }


def test_names_made_of_characters_openai_refuses_load_back_as_themselves(tmp_path):
    """A Chinese API name is a wire name (StableToolBench's standardize keeps CJK), which OpenAI's function names
    refuse: exported as underscores ("_______", "notice_____"), it was read back through api_key_name as "" and
    "notice", merging functions (8 of ToolEnv2404's 46,606 lost, 96 renamed). Exported names are wire names now."""
    from mirrorapi.names import api_key_name

    (tmp_path / "tools" / "Data").mkdir(parents=True)
    apis = ["生日", "星座运势", "notice生日", "notice", "3日天气", "^caret^", "ok"]
    tool = {"tool_name": "Calendar", "api_list": [{"name": name, "required_parameters": []} for name in apis]}
    (tmp_path / "tools" / "Data" / "calendar.json").write_text(json.dumps(tool, ensure_ascii=False), encoding="utf-8")
    first = export(tmp_path, "functions.json", "--tools", str(tmp_path / "tools"))
    again = export(tmp_path, "again.json", "--tools", str(tmp_path / "functions.json"))
    names = [f["function"]["name"] for f in first]
    assert len(set(names)) == len(apis) and all(api_key_name(name) == name for name in names), names
    assert sorted(f["function"]["name"] for f in again) == sorted(names)


def test_a_parameter_whose_wire_name_is_empty_loads_back(tmp_path):
    """ToolEnv2404's apk_downloader (Tools) has an optional parameter named `/`, whose wire name is "": exported as
    the property "", it was dropped on load (a falsy name skipped), so export -> load -> export lost it."""
    (tmp_path / "tools" / "Tools").mkdir(parents=True)
    api = {
        "name": "Get Apps by package name",
        "url": "https://apk-downloader.p.rapidapi.com/",
        "description": "Generate apk file by package name",
        "method": "GET",
        "required_parameters": [
            {"name": "id", "type": "STRING", "description": "Package name", "default": "com.freevpn.lite"}
        ],
        "optional_parameters": [{"name": "/", "type": "STRING", "description": "", "default": ""}],
    }
    tool = {"tool_name": "APK Downloader", "api_list": [api]}
    (tmp_path / "tools" / "Tools" / "apk_downloader.json").write_text(json.dumps(tool), encoding="utf-8")
    first = export(tmp_path, "functions.json", "--tools", str(tmp_path / "tools"))
    assert set(first[0]["function"]["parameters"]["properties"]) == {"is_id", ""}
    again = export(tmp_path, "again.json", "--tools", str(tmp_path / "functions.json"))
    assert (tmp_path / "again.json").read_text() == (tmp_path / "functions.json").read_text() and again == first
