"""`mirrorapi cache export` read the way StableToolBench reads it: its server looks a call up with
`str(json.loads(tool_input))`, in the order the agent sent the arguments (server/main.py at aa4ed9f,
notes/stabletoolbench.md §1, §3). Calls come from real agent traffic: StableToolBench's answer
trajectories (sent through our server) and the shared real pairs (imported). Also: an export never
writes outside its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.fake_engines import STUB_OBSERVATION
from mirrorapi.cli import main
from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache, export_stabletoolbench_cache, import_pairs
from mirrorapi.tools import ToolRegistry
from mirrorapi.transport_failures import transport_failure


def stabletoolbench_lookup(cache_folder: Path, body: dict):
    """The cached `{"error", "response"}` StableToolBench's server answers `body` with, or None (a miss),
    written from its source: category normalised; API name `change_name(standardize(.))` cut at
    `_for_<raw tool>`; tool folder `<standardize(tool)>_for_<category>` unless the tool name already ends
    so; arguments `json.loads(tool_input)` ("" is {}); the file's key is `str(arguments)`."""
    category = standardize_category(body["category"])
    raw_tool = body["tool_name"]
    api = api_key_name(body["api_name"]).split("_for_" + raw_tool)[0]
    tool_folder = raw_tool if raw_tool.endswith("_for_" + category) else f"{standardize(raw_tool)}_for_{category}"
    tool_input = body["tool_input"]
    if isinstance(tool_input, str):
        tool_input = json.loads(tool_input) if tool_input else {}
    path = cache_folder / category / tool_folder / f"{api}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get(str(tool_input))


def trajectory_calls(stabletoolbench: Path) -> list[dict]:
    """Every tool call of StableToolBench's example answer trajectories, as its agent client sent it to
    /virtual: the query's category, the standardized tool name, the API name, the model's raw
    arguments string (notes §1, §6)."""
    queries = {
        str(q["query_id"]): q
        for q in json.loads((stabletoolbench / "solvable_queries/test_instruction/G1_instruction.json").read_text())
    }
    calls = {}
    for path in sorted((stabletoolbench / "data_example/answer").glob("*/G1_instruction/*.json")):
        apis = {
            f"{api_key_name(a['api_name'])}_for_{standardize(a['tool_name'])}": a
            for a in queries[path.name.split("_")[0]]["api_list"]
        }
        for name, arguments in _function_calls(json.loads(path.read_text())):
            if name in apis:
                api = apis[name]
                calls[(name, arguments)] = {
                    "category": api["category_name"],
                    "tool_name": standardize(api["tool_name"]),
                    "api_name": api_key_name(api["api_name"]),
                    "tool_input": arguments,
                    "strip": "truncate",
                    "toolbench_key": "",
                }
    return list(calls.values())


def _function_calls(node) -> list[tuple[str, str]]:
    if isinstance(node, dict):
        call = node.get("function_call")
        found = [(call["name"], call["arguments"])] if isinstance(call, dict) and "arguments" in call else []
        return found + [c for value in node.values() for c in _function_calls(value)]
    if isinstance(node, list):
        return [c for value in node for c in _function_calls(value)]
    return []


def unsorted(arguments: dict) -> bool:
    return list(arguments) != sorted(arguments)


def test_calls_an_agent_sent_through_the_server_are_found_by_stabletoolbench(
    serve, engine_stub, shared_data, tmp_path
):
    stabletoolbench = shared_data / "stabletoolbench"
    calls = trajectory_calls(stabletoolbench)
    assert sum(unsorted(json.loads(c["tool_input"])) for c in calls) >= 2  # the kick.com and TheClique calls
    with serve(
        tools_folder=[str(stabletoolbench / "solvable_queries/test_instruction/G1_instruction.json")],
        api_base=[engine_stub()],
        cache_path=str(tmp_path / "c.sqlite"),
        missing_required="simulate",
    ) as server:
        for body in calls:
            assert server.virtual(body).json() == STUB_OBSERVATION
    cache = ResponseCache(tmp_path / "c.sqlite")
    report = export_stabletoolbench_cache(cache, tmp_path / "export")
    for body in calls:
        assert stabletoolbench_lookup(tmp_path / "export", body) == STUB_OBSERVATION, body
    distinct = {(c["tool_name"], c["api_name"], canonical_json(json.loads(c["tool_input"]))) for c in calls}
    assert report["entries"] == len(distinct) and report["refused"] == []
    # Our own lookups stay order-insensitive: the same call, keys reversed, is a hit.
    body = next(c for c in calls if unsorted(json.loads(c["tool_input"])))
    reversed_input = json.dumps(dict(reversed(json.loads(body["tool_input"]).items())))
    with serve(
        tools_folder=[str(stabletoolbench / "solvable_queries/test_instruction/G1_instruction.json")],
        api_base=[engine_stub()],
        cache_path=str(tmp_path / "c.sqlite"),
        mode="replay",
    ) as server:
        assert server.virtual({**body, "tool_input": reversed_input}).json() == STUB_OBSERVATION


def test_imported_real_pairs_are_found_by_stabletoolbench(shared_data, sample_tools, tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    first: dict[tuple, dict] = {}  # the first pair of each call is the one stored
    for name in ("api-bank.jsonl", "tau-bench.jsonl", "toolbench-example.jsonl"):
        path = shared_data / "pairs" / name
        assert import_pairs(cache, path, registry=ToolRegistry.load([sample_tools]))["unreadable"] == []
        for line in path.open(encoding="utf-8"):
            pair = json.loads(line)
            if transport_failure(**pair["response"]):  # not imported: the call is simulated (test_cache_cli.py)
                continue
            key = (
                pair["category"],
                standardize(pair["tool_name"]),
                api_key_name(pair["api_name"]),
                canonical_json(pair["tool_input"]),
            )
            first.setdefault(key, pair)
    export_stabletoolbench_cache(cache, tmp_path / "export")
    checked = 0
    for pair in first.values():
        body = {
            "category": pair["category"],
            "tool_name": standardize(pair["tool_name"]),
            "api_name": api_key_name(pair["api_name"]),
            "tool_input": json.dumps(pair["tool_input"], indent=2),
        }
        assert stabletoolbench_lookup(tmp_path / "export", body) == pair["response"], body
        checked += unsorted(pair["tool_input"])
    assert checked > 300  # real calls whose arguments are not in sorted order


# ------------------------------------------------------------------------------------ path safety
# `{outside}`: an absolute path in the test's own folder (a broken export must not litter elsewhere).
# (A tool's folder is its standardized name, as StableToolBench's server reads it: `../../outside` is `outside`.)
UNSAFE = [
    ("..", "tool", "api"),
    ("Data", "tool", "{outside}/api"),
    ("Data/../..", "tool", "api"),
    ("{outside}", "tool", "api"),
]


@pytest.mark.parametrize("names", UNSAFE, ids=["category ..", "absolute api", "category with /", "absolute category"])
def test_export_never_writes_outside_its_folder(names, tmp_path, capsys):
    names = tuple(name.format(outside=tmp_path / "outside") for name in names)
    db = tmp_path / "work" / "c.sqlite"
    cache = ResponseCache(db)
    cache.put(*names, canonical_json({"q": "x"}), "", "unsafe", "real")
    cache.put("Data", "theclique", "transfermarkt_search", canonical_json({"name": "Messi"}), "", "safe", "real")
    cache.close()
    before = {p for p in tmp_path.rglob("*")}
    out = tmp_path / "work" / "deep" / "export"
    assert main(["cache", "export", str(out), "--cache", str(db)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("1 entries written to 1 files")
    (refused,) = captured.err.splitlines()
    assert refused.startswith(f"refused, no file can be written for it: {'/'.join(names)} (1 entries): ")
    written = {p for p in tmp_path.rglob("*")} - before
    assert written and all(p.is_relative_to(out) or p in out.parents for p in written), written
    assert json.loads((out / "Data/theclique_for_Data/transfermarkt_search.json").read_text()) == {
        "{'name': 'Messi'}": {"error": "", "response": "safe"}
    }


def test_an_export_never_writes_through_a_link_left_in_its_folder(tmp_path):
    """The atomic write opened `<api>.json.tmp` as found: a link of that name left in the export folder (by whoever
    shares it) was followed, and the file it points to, outside the folder, got the export's JSON (audit of
    2026-12-01). The temporary file is made new; the link is removed, the file outside untouched."""
    db = tmp_path / "c.sqlite"
    cache = ResponseCache(db)
    cache.put("Data", "theclique", "transfermarkt_search", canonical_json({"name": "Messi"}), "", "safe", "real")
    cache.close()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    folder = tmp_path / "export" / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    (folder / "transfermarkt_search.json.tmp").symlink_to(victim)
    assert main(["cache", "export", str(tmp_path / "export"), "--cache", str(db)]) == 0
    assert victim.read_text() == "mine"
    written = folder / "transfermarkt_search.json"
    assert not written.is_symlink() and json.loads(written.read_text())["{'name': 'Messi'}"]["response"] == "safe"
    assert sorted(p.name for p in folder.iterdir()) == ["transfermarkt_search.json"]


def test_a_tool_whose_file_name_is_not_standardized_is_exported_where_stabletoolbench_reads_it(tmp_path):
    """StableToolBench's server reads `<standardize(tool_name)>_for_<category>` whatever the tools folder's file is
    called; a ToolEyes tool (`API_BASKETBALL.json`, shipped in data/tooleyes) was written under its file's name."""
    repo = Path(__file__).resolve().parents[2]
    registry = ToolRegistry.load([repo / "data" / "tooleyes" / "tools"])
    pair = {
        "source": "tooleyes",
        "episode": "e1",
        "step": 0,
        "category": "Competition",
        "tool_name": "API_BASKETBALL",
        "api_name": "timezone",
        "tool_input": {},
        "response": {"error": "", "response": '["Europe/London"]'},
    }
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(pair) + "\n", encoding="utf-8")
    cache = ResponseCache(tmp_path / "cache.sqlite")
    assert import_pairs(cache, pairs, registry)["stored"] == 1
    export_stabletoolbench_cache(cache, tmp_path / "export")
    cache.close()
    body = {"category": "Competition", "tool_name": standardize("API_BASKETBALL"), "api_name": "timezone"}
    assert stabletoolbench_lookup(tmp_path / "export", {**body, "tool_input": "{}"}) == pair["response"]


def test_a_name_as_long_as_a_file_name_may_be_is_exported_and_a_nul_is_named_as_such(tmp_path, capsys):
    """ToolEnv2404 has an API whose file name is 248 bytes, which StableToolBench's server writes; names over 200 bytes
    were refused. A NUL was reported as "contains a path separator"."""
    long_api = "a" * (251 - len(".json"))
    db = tmp_path / "c.sqlite"
    cache = ResponseCache(db)
    cache.put("Data", "tool", long_api, canonical_json({"q": "x"}), "", "long", "real")
    cache.put("Data", "tool", long_api + "b", canonical_json({"q": "x"}), "", "too long", "real")
    cache.put("Da\0ta", "tool", "api", canonical_json({"q": "x"}), "", "nul", "real")
    cache.close()
    assert main(["cache", "export", str(tmp_path / "export"), "--cache", str(db)]) == 1
    refused = capsys.readouterr().err.splitlines()
    assert (tmp_path / "export" / "Data" / "tool_for_Data" / f"{long_api}.json").is_file()
    assert len(refused) == 2 and any("contains a NUL character" in line for line in refused), refused
    assert any("is longer than a file name may be" in line for line in refused), refused
