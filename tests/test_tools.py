"""ToolRegistry: loading real tools folders, resolving names as StableToolBench's clients send them."""

import json
import os
import subprocess
import sys

import pytest

from mirrorapi.cli import main as cli_main
from mirrorapi.names import api_key_name, standardize
from mirrorapi.tools import RegistryError, ToolRegistry, UnknownName

QUERY_GROUPS = ["G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category", "G3_instruction"]


@pytest.fixture(scope="module")
def toolenv(shared_data):
    return ToolRegistry.load([shared_data / "toolenv/toolenv2404"])


@pytest.fixture(scope="module")
def toolenv_and_queries(shared_data):
    queries = shared_data / "stabletoolbench/solvable_queries/test_instruction"
    return ToolRegistry.load([shared_data / "toolenv/toolenv2404"] + [queries / f"{g}.json" for g in QUERY_GROUPS])


def test_loads_the_whole_toolenv2404(toolenv):
    stats = toolenv.stats()
    assert stats["categories"] == 49
    assert stats["tools"] == 12301  # the dotfile `.json` included
    # 46,803 API entries; 197 repeat a standardized name inside their tool (the first one wins).
    assert stats["apis"] == 46803 - 197
    assert stats["apis_listed_again"] == 197  # told, not silent: `tools stats` prints the count
    assert stats["unreadable"] == 0


def test_resolves_every_test_query_api_as_the_agents_send_it(toolenv_and_queries, shared_data):
    base = shared_data / "stabletoolbench/solvable_queries/test_instruction"
    calls = set()
    for group in QUERY_GROUPS:
        for query in json.loads((base / f"{group}.json").read_text()):
            for a in query["api_list"]:
                calls.add((a["category_name"], a["tool_name"], a["api_name"]))
    assert len(calls) == 2490
    for category, tool, api in calls:
        # What StableToolBench's client puts in the /virtual body (notes §6).
        doc = toolenv_and_queries.resolve(category, standardize(tool), api_key_name(api))
        assert doc.category == category and doc.api == api_key_name(api)
        # The same call with the tool sent as `<tool>_for_<Category>`, and the API as `<api>_for_<tool>`.
        assert (
            toolenv_and_queries.resolve(
                category, f"{standardize(tool)}_for_{category}", f"{api_key_name(api)}_for_{doc.tool}"
            )
            is doc
        )


def test_tools_with_for_in_their_own_name(toolenv_and_queries):
    # StableToolBench cuts at the first `_for_` and gets these six test-set tools wrong (notes §8.4).
    for category, tool in [
        ("Business", "realtor_data_api_for_real_estate"),
        ("Tools", "placeholder_text_api_for_your_application"),
        ("Tools", "usa_jobs_for_it"),
        ("Data", "realtor_api_for_real_estate_data"),
        ("Science", "materials_platform_for_data_science"),
        ("Weather", "testing_for_my_use"),
    ]:
        found = toolenv_and_queries.find_tool(category, tool)
        assert found.name == tool
        assert toolenv_and_queries.find_tool(category, f"{tool}_for_{category}") is found
        api = next(iter(found.apis))
        assert toolenv_and_queries.resolve(category, f"{tool}_for_{category}", api).tool == tool


def test_query_files_fill_response_templates(toolenv, toolenv_and_queries):
    # Songkick concert has no `template_response` in ToolEnv2404; the G1 query file has one.
    assert toolenv.resolve("Data", "theclique", "songkick_concert").template_response is None
    merged = toolenv_and_queries.resolve("Data", "theclique", "songkick_concert")
    assert merged.template_response["line_up"][0]["_list_length"] == 2
    assert merged.tool_description == "API for TheClique company"  # the tools folder still wins


def test_keeps_response_schemas(toolenv):
    with_schema = [d for d in toolenv if d.response_schema]
    assert len(with_schema) > 10000
    assert all(isinstance(d.response_schema, dict) for d in with_schema)


def test_tool_alias_for_names_the_crawler_shortened(toolenv):
    # Stem `random_yesno`, but a client standardising `Random Yes/No` sends `random_yes_no`.
    assert toolenv.find_tool("Entertainment", "random_yes_no").name == "random_yesno"


def test_unknown_names_suggest_the_closest(toolenv):
    with pytest.raises(UnknownName) as err:
        toolenv.resolve("Dta", "theclique", "songkick_concert")
    assert err.value.kind == "category" and "Data" in err.value.suggestions
    with pytest.raises(UnknownName) as err:
        toolenv.resolve("Data", "thecliqe", "songkick_concert")
    assert err.value.kind == "tool" and "theclique" in err.value.suggestions
    with pytest.raises(UnknownName) as err:
        toolenv.resolve("Data", "theclique", "songkick_concrt")
    assert err.value.kind == "API" and err.value.suggestions[0] == "songkick_concert"
    assert "songkick_concert" in str(err.value)


def test_tolerates_corrupt_and_odd_files(tmp_path):
    cat = tmp_path / "tools" / "Misc"
    cat.mkdir(parents=True)
    (cat / "broken.json").write_text('{"tool_name": "Broken", "api_list": [')
    (cat / "latin1.json").write_bytes(b'{"tool_name": "\xe9t\xe9"}')
    (cat / "list.json").write_text("[1, 2, 3]")
    (cat / "odd.json").write_text(
        json.dumps(
            {
                "tool_name": None,
                "tool_description": 42,
                "api_list": [
                    None,
                    "x",
                    {
                        "name": "Get Thing",
                        "description": None,
                        "required_parameters": None,
                        "optional_parameters": [{"name": "id", "type": None}, "junk", {"type": "STRING"}],
                        "schema": "",
                    },
                    {"name": 7, "template_response": '{"a": "str"}'},
                ],
            }
        )
    )
    registry = ToolRegistry.load([tmp_path / "tools"])
    unreadable = {path.split("/")[-1]: reason for path, reason in registry.unreadable}
    assert set(unreadable) == {"broken.json", "latin1.json", "list.json"}
    assert "JSONDecodeError" in unreadable["broken.json"]
    doc = registry.resolve("Misc", "odd", "get_thing")
    assert doc.tool_title == "odd" and doc.tool_description == "42" and doc.description == ""
    assert doc.required_parameters == [] and [p["name"] for p in doc.optional_parameters] == ["id"]
    assert doc.parameter_names() == ([], ["is_id"])
    assert registry.resolve("Misc", "odd", "get_7").template_response == {"a": "str"}


def test_a_file_nested_past_the_recursion_limit_is_skipped_not_fatal(tmp_path):
    cat = tmp_path / "tools" / "Misc"
    cat.mkdir(parents=True)
    (cat / "deep.json").write_text('{"tool_name": "Deep", "api_list": ' + "[" * 5000 + "]" * 5000 + "}")
    deep_template = {"name": "Get", "template_response": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"}
    (cat / "fine.json").write_text(json.dumps({"tool_name": "Fine", "api_list": [deep_template]}))
    registry = ToolRegistry.load([tmp_path / "tools"])  # was a RecursionError: no tool loaded at all
    assert [path.split("/")[-1] for path, _ in registry.unreadable] == ["deep.json"]
    assert isinstance(registry.resolve("Misc", "fine", "get").template_response, str)  # kept as the text it is


def test_a_file_larger_than_memory_is_skipped_not_fatal(tmp_path):
    """A sparse `.json` of a terabyte (no disk used) in a tools folder or a StableToolBench cache folder stopped the
    load, `tools stats`, `cache import` and the server's start with a MemoryError traceback (audit of 2026-12-01);
    it is an unreadable file, named as such, beside the files that are read."""
    from mirrorapi.records import read_stabletoolbench_cache

    cat = tmp_path / "tools" / "Misc"
    cat.mkdir(parents=True)
    with open(cat / "huge.json", "wb") as fh:
        fh.truncate(1 << 40)
    (cat / "fine.json").write_text(json.dumps({"tool_name": "Fine", "api_list": [{"name": "Get"}]}))
    registry = ToolRegistry.load([tmp_path / "tools"])
    assert [(path.split("/")[-1], reason.split(":")[0]) for path, reason in registry.unreadable] == [
        ("huge.json", "MemoryError")
    ]
    assert registry.resolve("Misc", "fine", "get").api == "get"
    api = tmp_path / "cache" / "Misc" / "fine_for_Misc"
    api.mkdir(parents=True)
    with open(api / "get.json", "wb") as fh:
        fh.truncate(1 << 40)
    bad: list[str] = []
    assert list(read_stabletoolbench_cache(tmp_path / "cache", bad.append)) == []
    assert bad == ["Misc/fine_for_Misc/get.json: unreadable (MemoryError)"]


def test_an_api_listed_twice_in_one_file_is_its_first_entry(tmp_path):
    """197 names of ToolEnv2404 are listed twice in their tool's file. Upstream's client takes the first entry and
    stops (rapidapi.py's fetch_api_json); filling its gaps from the second gave microbooks' `getTaxes` (no
    parameters) another API's required `id`, and a correct call `{}` was refused."""
    cat = tmp_path / "tools" / "Finance"
    cat.mkdir(parents=True)
    first = {"name": "getTaxes", "description": "", "required_parameters": [], "optional_parameters": []}
    second = {
        "name": "getTaxes",
        "description": "Get a line item",
        "required_parameters": [{"name": "id", "type": "STRING", "description": "The Id of the Line Item"}],
        "optional_parameters": [],
    }
    (cat / "microbooks.json").write_text(json.dumps({"tool_name": "microbooks", "api_list": [first, second]}))
    doc = ToolRegistry.load([tmp_path / "tools"]).resolve("Finance", "microbooks", "gettaxes")
    assert doc.required_parameters == [] and doc.description == ""


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(RegistryError, match="not found"):
        ToolRegistry.load([tmp_path / "nope"])


def test_a_folder_without_tool_files_is_an_error_that_says_where_they_are(samples, tmp_path, capsys):
    """`tools stats` of a folder one level too high (or empty) printed 0 tools with exit 0, and `tools export` wrote
    `[]`: one line now, naming the layout and a subfolder (or the parent) that has it."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "tools").symlink_to(samples / "tools")
    out = tmp_path / "functions.json"
    for folder, hint in (
        (tmp_path / "empty", ""),
        (tmp_path / "high", f"; did you mean {tmp_path / 'high' / 'tools'}?"),
        (
            samples / "tools" / "Data",
            f" (it holds <tool>.json files itself, as a category folder does); did you mean {samples / 'tools'}?",
        ),
    ):
        for command in (["stats", str(folder)], ["export", "--tools", str(folder), "--out", str(out)]):
            assert cli_main(["tools", *command]) == 2
            says = f"tools folder {folder} holds no <Category>/<tool>.json file{hint}"
            assert capsys.readouterr().err.splitlines() == [f"mirrorapi tools {command[0]}: error: {says}"]
    assert not out.exists()


def test_a_json_lines_file_given_as_a_tool_source_is_one_line(samples):
    """A pairs file given to `tools stats`: a "skipping unreadable tool file" warning, then a JSONDecodeError ("Extra
    data: line 2 column 1"). One line now, saying what the file is and what is taken."""
    for command in (["stats", str(samples / "pairs.jsonl")], ["export", "--tools", str(samples / "judge.jsonl")]):
        run = [sys.executable, "-m", "mirrorapi.cli", "tools", *command]
        done, given = subprocess.run(run, capture_output=True, text=True), command[-1]
        assert done.returncode == 2 and done.stderr.splitlines() == [
            f"mirrorapi tools {command[0]}: error: {given} is JSON Lines (one record a line), not a tool source: give "
            "a tools folder (<Category>/<tool>.json), a StableToolBench query file or an OpenAI function list"
        ]


def test_openai_function_files(tmp_path):
    functions = [
        {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
        {"type": "function", "function": {"name": "list_cities", "parameters": {"type": "object", "properties": {}}}},
    ]
    path = tmp_path / "weather_tools.json"
    path.write_text(json.dumps(functions))
    registry = ToolRegistry.load([path])
    doc = registry.resolve("Custom", "weather_tools", "get_weather")
    assert [p["name"] for p in doc.required_parameters] == ["city"]
    assert [(p["name"], p["type"]) for p in doc.optional_parameters] == [("days", "NUMBER")]
    assert registry.resolve("Custom", "weather_tools", "list_cities").description == ""


def test_samples_resolve_every_bundled_pair(samples):
    registry = ToolRegistry.load([samples / "tools"])
    pairs = [json.loads(line) for line in open(samples / "pairs.jsonl", encoding="utf-8")]
    assert len(pairs) > 300
    for p in pairs:
        registry.resolve(p["category"], p["tool_name"], p["api_name"])


def test_cli_stats_json(samples, capsys):
    assert cli_main(["tools", "stats", str(samples / "tools"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert {"categories", "tools", "apis", "unreadable", "load_seconds"} <= set(stats)
    assert stats["tools"] == 46 and stats["unreadable"] == 0


def test_cli_show_and_errors_without_traceback(samples, tmp_path):
    run = [sys.executable, "-m", "mirrorapi.cli"]
    shown = subprocess.run(
        run
        + ["tools", "show", "APIBank", "apibank_account", "GetUserToken", "--json", "--tools", str(samples / "tools")],
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["api_title"] == "GetUserToken"
    for args in (
        ["tools", "stats", str(tmp_path / "missing")],
        ["tools", "show", "APIBank", "apibank_acount", "--tools", str(samples / "tools")],
    ):
        result = subprocess.run(run + args, capture_output=True, text=True)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith(f"mirrorapi tools {args[1]}: error:")
    unknown = subprocess.run(
        run + ["tools", "show", "APIBank", "apibank_acount", "--tools", str(samples / "tools")],
        capture_output=True,
        text=True,
    )
    assert "apibank_account" in unknown.stderr  # the closest known name


# ------------------------------------------------------------------------ the compiled index
def _settled_tools_folder(tmp_path, apis=("first", "second")):
    """A tools folder whose files and folders were last changed a minute ago (an index is written only for
    a folder that has settled, mirrorapi.tools_index.SETTLE_SECONDS)."""
    folder = tmp_path / "tools"
    (folder / "Data").mkdir(parents=True)
    tool = {
        "tool_name": "Weather",
        "tool_description": "d",
        "api_list": [
            {
                "name": name,
                "description": f"the {name} API",
                "method": "GET",
                "required_parameters": [],
                "optional_parameters": [],
                "template_response": {"t": "str"},
            }
            for name in apis
        ],
    }
    (folder / "Data" / "weather.json").write_text(json.dumps(tool))
    (folder / "Data" / "broken.json").write_text("{not json")
    _age(folder)
    return folder


def _age(folder, seconds=60):
    import os
    import time

    past = time.time() - seconds
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (past, past))


def test_index_is_written_then_read_with_the_same_docs(tmp_path):
    folder = _settled_tools_folder(tmp_path)
    first = ToolRegistry.load([folder])
    second = ToolRegistry.load([folder])
    assert first.indexes == [(str(folder), "written")] and second.indexes == [(str(folder), "read")]
    assert [d.to_dict() for d in second] == [d.to_dict() for d in first]
    assert second.unreadable == first.unreadable and len(second.unreadable) == 1


def test_index_is_rebuilt_when_a_file_changes_or_is_added(tmp_path):
    folder = _settled_tools_folder(tmp_path)
    ToolRegistry.load([folder])
    path = folder / "Data" / "weather.json"
    path.write_text(path.read_text().replace("the first API", "the FIRST API"))  # same size, in place
    _age(folder, seconds=30)
    edited = ToolRegistry.load([folder])
    assert edited.indexes == [(str(folder), "written")]
    assert edited.resolve("Data", "weather", "first").description == "the FIRST API"
    (folder / "Data" / "sun.json").write_text(json.dumps({"tool_name": "Sun", "api_list": [{"name": "rise"}]}))
    _age(folder, seconds=20)
    assert ToolRegistry.load([folder]).resolve("Data", "sun", "rise").api == "rise"


def test_an_edit_whose_time_was_put_back_is_not_served_from_the_index(tmp_path):
    """`cp -p`, `touch -r` (and a `chmod` that made a file readable) leave a file's mtime as it was; its ctime
    changes, and so does the index's fingerprint: the old docs were served."""
    folder = _settled_tools_folder(tmp_path)
    ToolRegistry.load([folder])
    path = folder / "Data" / "weather.json"
    stat = path.stat()
    path.write_text(path.read_text().replace("the first API", "the FIRST API"))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # its time put back
    edited = ToolRegistry.load([folder])
    assert edited.resolve("Data", "weather", "first").description == "the FIRST API"


def test_without_a_home_folder_the_index_goes_beside_the_tools(tmp_path, monkeypatch):
    """No HOME and no passwd entry (a container's `--user`): Path.home() raises; the load did too."""
    from pathlib import Path

    from mirrorapi.tools_index import INDEX_DIR_ENV

    monkeypatch.delenv(INDEX_DIR_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    folder = _settled_tools_folder(tmp_path)
    assert ToolRegistry.load([folder]).indexes == [(str(folder), "written")]


def test_a_folder_changed_just_now_gets_no_index_yet(tmp_path):
    folder = _settled_tools_folder(tmp_path)
    (folder / "Data" / "weather.json").touch()
    assert ToolRegistry.load([folder]).indexes == [(str(folder), "not written: changed just now")]


def test_a_damaged_index_is_rebuilt(tmp_path):
    from mirrorapi.tools_index import locations

    folder = _settled_tools_folder(tmp_path)
    ToolRegistry.load([folder])
    (index,) = [p for p in locations(folder) if p.exists()]
    index.write_bytes(index.read_bytes()[:100])  # truncated
    again = ToolRegistry.load([folder])
    assert again.indexes == [(str(folder), "written")] and again.resolve("Data", "weather", "second")


def test_index_beside_the_folder_or_in_the_cache_folder_when_read_only(tmp_path, monkeypatch):
    from mirrorapi.tools_index import INDEX_DIR_ENV

    monkeypatch.delenv(INDEX_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = _settled_tools_folder(tmp_path / "writable")
    ToolRegistry.load([folder])
    assert (folder.parent / ".tools.mirrorapi-index").is_file() and not (tmp_path / "xdg").exists()

    folder = _settled_tools_folder(tmp_path / "read-only")
    folder.parent.chmod(0o555)  # no write bit: respected even by root
    try:
        assert ToolRegistry.load([folder]).indexes == [(str(folder), "written")]
        assert ToolRegistry.load([folder]).indexes == [(str(folder), "read")]
    finally:
        folder.parent.chmod(0o755)
    assert not (folder.parent / ".tools.mirrorapi-index").exists()
    assert len(list((tmp_path / "xdg" / "mirrorapi" / "tools-index").iterdir())) == 1


def test_an_index_whose_body_was_damaged_is_not_served(tmp_path):
    """One flipped bit inside a doc's text still loads as a valid index (marshal keeps strings as they are), and its
    docs were served as the folder's; the body's digest, checked at each load, sends the load back to the folder."""
    from mirrorapi.tools_index import locations

    folder = _settled_tools_folder(tmp_path)
    ToolRegistry.load([folder])
    (index,) = [p for p in locations(folder) if p.exists()]
    data = index.read_bytes()
    at = data.index(b"the second API") + len(b"the s")
    index.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])  # "e" -> "E": one bit
    again = ToolRegistry.load([folder])
    assert again.indexes == [(str(folder), "written")]
    assert again.resolve("Data", "weather", "second").description == "the second API"


def test_a_tool_whose_file_name_is_not_standardized_is_found_as_clients_name_it():
    """ToolEyes' tools folder (shipped in data/tooleyes) names 70 files as their tools are titled (`API_BASKETBALL`);
    ToolBench's clients send a tool's standardized name and a function's `<api>_for_<standardized tool>`
    (StableToolBench's `standardize`, `change_name`), which were unknown APIs for those tools."""
    from pathlib import Path

    registry = ToolRegistry.load([Path(__file__).resolve().parents[1] / "data" / "tooleyes" / "tools"])
    for tool, api in (
        ("API_BASKETBALL", "timezone"),
        ("api_basketball", "timezone"),
        ("api_basketball", "timezone_for_api_basketball"),
        ("API_BASKETBALL", "timezone_for_API_BASKETBALL"),
    ):
        doc = registry.resolve("Competition", tool, api)
        assert (doc.tool, doc.api) == ("API_BASKETBALL", "timezone"), (tool, api)


def test_make_samples_without_the_shared_data_changes_nothing(tmp_path):
    """`scripts/make_samples.py` removed the samples' tools/ and stabletoolbench/ before it read anything, so run in
    a clone without `../shared` it ended in a traceback with them gone (audit of 2026-12-01)."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "samples"
    shutil.copytree(repo / "data" / "samples" / "tools", out / "tools")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result = subprocess.run(
        [sys.executable, "scripts/make_samples.py", "--shared", str(tmp_path / "no-shared"), "--out", str(out)],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert (
        result.returncode == 2
        and "is not the shared data folder" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
