"""The three input shapes: our pair JSONL, a StableToolBench cache folder, MirrorAPI-style alpaca files."""

import json
from pathlib import Path

import pytest

from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records
from mirrorapi.data.sources import read_alpaca
from mirrorapi.prompts.simulator_formats import simulator_messages
from mirrorapi.records import SourceError, read_pairs_jsonl, read_stabletoolbench_cache
from mirrorapi.tools import ToolRegistry

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry.load([SAMPLES / "tools"])


@pytest.fixture(scope="module")
def rapidapi_pairs():
    """The real ToolBench (RapidAPI) pairs of the sample: what a StableToolBench cache holds."""
    pairs = [json.loads(line) for line in open(SAMPLES / "pairs.jsonl", encoding="utf-8")]
    return [p for p in pairs if p["source"] == "toolbench-example"]


def write_stabletoolbench_cache(folder, pairs):
    """A cache folder laid out and keyed the way StableToolBench's server writes it (notes §3)."""
    files = {}
    for p in pairs:
        path = folder / p["category"] / f"{p['tool_name']}_for_{p['category']}" / f"{p['api_name']}.json"
        files.setdefault(path, {}).setdefault(str(p["tool_input"]), p["response"])
    for path, entries in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entries, indent=4), encoding="utf-8")


def test_pairs_jsonl_skips_bad_lines_and_reports_them(tmp_path):
    good = open(SAMPLES / "pairs.jsonl", encoding="utf-8").readline()
    path = tmp_path / "pairs.jsonl"
    not_an_object = json.loads(good) | {"tool_input": ["a", "list"]}
    half_a_pair = json.loads(good) | {"response": {"error": "", "response": json.loads('"Messi \\ud83d"')}}
    no_category = json.loads(good) | {"category": None}  # once a traceback of `cache import`
    odd_step, odd_episode = json.loads(good) | {"step": "x"}, json.loads(good) | {"episode": [1]}  # of a build
    # past int64 a traceback of pyarrow once the whole build was done; below 0 no order of the pairs schema
    huge_step, negative_step = json.loads(good) | {"step": 10**30}, json.loads(good) | {"step": -1}
    deep = '{"source": ' + "[" * 5000  # nested past Python's recursion limit
    path.write_text(
        good
        + "not json\n"
        + json.dumps({"source": "x"})
        + "\n\n"
        + json.dumps(not_an_object)
        + "\n"
        + json.dumps(half_a_pair)  # "\\ud83d": a lone surrogate, which no UTF-8 store or prompt can hold
        + "\n"
        + json.dumps(no_category)
        + "\n"
        + json.dumps(odd_step)
        + "\n"
        + json.dumps(odd_episode)
        + "\n"
        + deep
        + "\n"
        + json.dumps(huge_step)
        + "\n"
        + json.dumps(negative_step)
        + "\n",
        encoding="utf-8",
    )
    bad = []
    pairs = list(read_pairs_jsonl(path, bad.append))
    assert len(pairs) == 1 and pairs[0] == json.loads(good)
    assert [b.split(":")[1] for b in bad] == ["2", "3", "5", "6", "7", "8", "9", "10", "11", "12"]
    assert "missing" in bad[1] and "tool_input" in bad[2] and "lone surrogate" in bad[3]
    assert "non-string category" in bad[4] and "step is not" in bad[5] and "episode is not" in bad[6]
    assert "nested more than 200 levels deep" in bad[7]
    assert bad[8:] == [f"pairs.jsonl:{n}: step is not from 0 to 2**63 - 1" for n in (11, 12)]
    with pytest.raises(SourceError, match="not found"):
        list(read_pairs_jsonl(tmp_path / "absent.jsonl"))


@pytest.mark.parametrize("levels", [500, 990])
def test_a_pair_nested_deeper_than_the_code_that_walks_it_goes_is_a_bad_line(tmp_path, levels):
    """A `tool_input` nested 500 deep passed the parser and stopped the whole build with a RecursionError
    (`utf8_only` recurses twice a level): now a bad line, as one nested past the parser's own limit."""
    good = open(SAMPLES / "pairs.jsonl", encoding="utf-8").readline()
    path = tmp_path / "pairs.jsonl"
    deep = json.dumps(json.loads(good) | {"tool_input": "DEEP"})  # json.dumps itself stops short of 990
    deep = deep.replace('"DEEP"', '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1))
    path.write_text(deep + "\n" + good, encoding="utf-8")
    bad = []
    assert list(read_pairs_jsonl(path, bad.append)) == [json.loads(good)]
    assert bad == ["pairs.jsonl:1: nested more than 200 levels deep"]


def test_a_cache_entry_nested_too_deep_is_a_bad_entry(tmp_path):
    api_dir = tmp_path / "cache" / "Data" / "deep_for_Data"
    api_dir.mkdir(parents=True)
    deep = "[" * 500 + "]" * 500
    entries = '{"{\'q\': 1}": {"error": "", "response": ' + deep + '}, "{\'q\': 2}": {"error": "", "response": "ok"}}'
    (api_dir / "search.json").write_text(entries, encoding="utf-8")
    bad = []
    pairs = list(read_stabletoolbench_cache(tmp_path / "cache", bad.append))
    assert [p["tool_input"] for p in pairs] == [{"q": 2}]
    assert bad == ["Data/deep_for_Data/search.json: entry \"{'q': 1}\" nested more than 200 levels deep"]


def test_stabletoolbench_cache_gives_the_same_records_as_the_pairs(tmp_path, registry, rapidapi_pairs):
    write_stabletoolbench_cache(tmp_path / "cache", rapidapi_pairs)
    from_cache = list(read_stabletoolbench_cache(tmp_path / "cache"))
    options = SimulatorDataOptions(ood_fraction=0, id_fraction=0)
    via_cache, cache_stats = build_simulator_records(from_cache, registry, options)
    via_pairs, pair_stats = build_simulator_records(rapidapi_pairs, registry, options)

    def calls(records):
        return {
            (r["category"], r["tool"], r["api"], r["arguments"]): (r["prompt"], r["completion"])
            for r in records["train"]
        }

    assert calls(via_cache) == calls(via_pairs)
    assert cache_stats["kept"]["total"] == pair_stats["kept"]["total"] > 50
    assert cache_stats["dropped"]["transport_failure"] == pair_stats["dropped"]["transport_failure"] > 0


def test_stabletoolbench_cache_oddities(tmp_path):
    api_dir = tmp_path / "cache" / "Jobs" / "usa_jobs_for_it_for_Jobs"
    api_dir.mkdir(parents=True)
    (api_dir / "search_jobs.json").write_text(
        json.dumps(
            {
                "{'keyword': 'python', 'remote': True, 'page': None}": {"error": "", "response": "{'jobs': []}"},
                "{'keyword': ": {"error": "", "response": "cut key"},
                "['not', 'a', 'dict']": {"error": "", "response": "x"},
                "{}": "not an observation",
            }
        ),
        encoding="utf-8",
    )
    (api_dir / "broken.json").write_text("{not json", encoding="utf-8")
    bad = []
    pairs = list(read_stabletoolbench_cache(tmp_path / "cache", bad.append))
    assert len(pairs) == 1
    # `_for_<Category>` is removed exactly: the tool's own `_for_it` stays.
    assert (pairs[0]["category"], pairs[0]["tool_name"], pairs[0]["api_name"]) == (
        "Jobs",
        "usa_jobs_for_it",
        "search_jobs",
    )
    assert pairs[0]["tool_input"] == {"keyword": "python", "remote": True, "page": None}
    assert len(bad) == 4 and any("broken.json" in b for b in bad)


def test_alpaca_records_are_parsed_back_to_doc_request_and_observation(tmp_path, registry, rapidapi_pairs):
    # An alpaca file in MirrorAPI's layout: the instruction is StableToolBench's `API doc:`/`Request:`
    # user message, the output the model's JSON answer with its `mechanism_of_the_api` field.
    records, expected = [], []
    for p in rapidapi_pairs[:20]:
        doc = registry.resolve(p["category"], p["tool_name"], p["api_name"])
        user = simulator_messages(doc, p["tool_input"], fmt="stabletoolbench", system_prompt="SYSTEM")[1]["content"]
        output = json.dumps({"mechanism_of_the_api": "It looks things up.", **p["response"]})
        records.append({"system": "SYSTEM", "instruction": user, "output": output})
        expected.append((doc, p))
    records.append({"system": "S", "instruction": "no layout here", "output": "{}"})
    path = tmp_path / "train_sft.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    bad = []
    pairs = list(read_alpaca(path, bad.append))
    assert len(pairs) == 20 and len(bad) == 1
    for pair, (doc, original) in zip(pairs, expected, strict=True):
        assert (pair["doc"].api_title, pair["doc"].description) == (doc.api_title, doc.description)
        assert pair["doc"].required_parameters == doc.required_parameters
        assert (pair["category"], pair["tool_name"], pair["api_name"]) == (doc.category, doc.tool, doc.api)
        assert pair["tool_input"] == original["tool_input"]
        assert pair["response"] == original["response"]
    # Without a registry the embedded doc is used; with one, the registry's (as the server renders it).
    alone, _ = build_simulator_records(pairs, ToolRegistry(), SimulatorDataOptions(ood_fraction=0, id_fraction=0))
    assert len(alone["train"]) > 0
    with_registry, _ = build_simulator_records(pairs, registry, SimulatorDataOptions(ood_fraction=0, id_fraction=0))
    for record in with_registry["train"]:
        doc = registry.resolve(record["category"], record["tool"], record["api"])
        assert record["prompt"] == simulator_messages(doc, json.loads(record["arguments"]))


def test_alpaca_jsonl_is_read_too(tmp_path):
    line = {
        "system": "S",
        "output": '{"error": "", "response": "ok"}',
        "instruction": "API doc:\n{'api_name': 'Ping', 'api_description': 'd', 'required_parameters': [], "
        "'optional_parameters': [], 'tool_description': 't', 'tool_name': 'pinger', "
        "'tool_category': 'Data'}\n\nRequest:\n{}",
    }
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    (pair,) = read_alpaca(path)
    assert (pair["category"], pair["tool_name"], pair["api_name"], pair["response"]) == (
        "Data",
        "pinger",
        "ping",
        {"error": "", "response": "ok"},
    )
