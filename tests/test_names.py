"""StableToolBench's name normalisation, checked against names its own pipeline produced."""

import json
import os

import pytest

from mirrorapi.names import api_key_name, change_name, standardize, standardize_category


@pytest.mark.parametrize(
    "raw, expected",
    [
        # Examples documented for StableToolBench's server/utils.py (notes §1).
        ("50K Radio Stations", "get_50k_radio_stations"),
        ("TheClique", "theclique"),
        ("Transfermarkt search", "transfermarkt_search"),
        ("properties/get-broadband", "properties_get_broadband"),
        ("__Leading and trailing__", "leading_and_trailing"),
        ("a^b", "a^b"),  # the `^` quirk: upstream's character class keeps it
        ("中文 API", "中文_api"),  # CJK U+4E00–U+9FA5 is kept
        ("테스트위드", ""),  # Hangul is not: ToolEnv2404's dotfile `.json`
        ("!!!", ""),
    ],
)
def test_standardize_documented_cases(raw, expected):
    assert standardize(raw) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("id", "is_id"),
        ("from", "is_from"),
        ("class", "is_class"),
        ("return", "is_return"),
        ("false", "is_false"),
        ("true", "is_true"),
        ("and", "is_and"),
        ("ids", "ids"),
        ("Id", "Id"),
    ],
)
def test_change_name_only_renames_reserved_words(raw, expected):
    assert change_name(raw) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("News, Media", "News_Media"),
        ("Artificial Intelligence/Machine Learning", "Artificial_Intelligence_Machine_Learning"),
        ("Health and Fitness", "Health_and_Fitness"),
        ("Data", "Data"),
        ("a , b", "a__b"),  # `___` -> `__`: one non-overlapping pass, as upstream
    ],
)
def test_standardize_category(raw, expected):
    assert standardize_category(raw) == expected


def _walk_tools(root):
    for cat in os.scandir(root):
        for entry in os.scandir(cat.path):
            with open(entry.path, encoding="utf-8") as fh:
                yield cat.name, entry.name[:-5], json.load(fh)


def test_toolenv2404_file_stems_follow_standardize(shared_data):
    # ToolEnv2404's crawler dropped `/` and `,` before standardising (`Random Yes/No` -> random_yesno);
    # with that step, all 12,301 real file stems are standardize(tool_name).
    seen = mismatched = 0
    for _, stem, doc in _walk_tools(shared_data / "toolenv/toolenv2404"):
        seen += 1
        mismatched += standardize(doc["tool_name"].replace("/", "").replace(",", "")) != stem
    assert seen == 12301
    assert mismatched == 0


def test_toolenv2404_categories_are_already_normalised(shared_data):
    cats = [e.name for e in os.scandir(shared_data / "toolenv/toolenv2404")]
    assert len(cats) == 49
    assert all(standardize_category(c) == c for c in cats)


def test_function_names_of_stabletoolbench_answers(shared_data):
    # The agents' function names in StableToolBench's converted answers were made by its client from
    # the query's api_list: change_name(standardize(api)) + "_for_" + standardize(tool), last 64 chars.
    stb = shared_data / "stabletoolbench"
    queries = {
        str(q["query_id"]): q
        for q in json.loads((stb / "solvable_queries/test_instruction/G1_instruction.json").read_text())
    }
    checked = 0
    for path in (stb / "data_example/model_predictions_converted").glob("*/G1_instruction.json"):
        for qid, answer in json.loads(path.read_text()).items():
            names = [t["name"] for t in answer["available_tools"] if t["name"] != "Finish"]
            expected = [
                (api_key_name(a["api_name"]) + "_for_" + standardize(a["tool_name"]))[-64:]
                for a in queries[qid]["api_list"]
            ]
            assert names == expected
            checked += len(names)
    assert checked == 46


def test_test_query_categories_are_normalised_and_known(shared_data):
    cats = {e.name for e in os.scandir(shared_data / "toolenv/toolenv2404")}
    seen = set()
    for path in (shared_data / "stabletoolbench/solvable_queries/test_instruction").glob("*.json"):
        for query in json.loads(path.read_text()):
            seen.update(a["category_name"] for a in query["api_list"])
    assert len(seen) == 47
    assert {standardize_category(c) for c in seen} == seen
    assert seen <= cats


def test_toolbench_pairs_use_wire_names_of_their_docs(shared_data):
    # toolbench-example pairs carry the names agents sent (`transitaire`, `is_id`); the docs list
    # the originals (`Transitaire`, `id`). Every pair's API maps to its doc through api_key_name.
    docs = {}
    for cat, stem, doc in _walk_tools(shared_data / "toolenv/realtools"):
        docs[(cat, stem)] = doc
    pairs = [json.loads(line) for line in open(shared_data / "pairs/toolbench-example.jsonl", encoding="utf-8")]
    renamed_args = 0
    for p in pairs:
        doc = docs[(p["category"], p["tool_name"])]
        api = next(a for a in doc["api_list"] if api_key_name(a["name"]) == p["api_name"])
        wire = {api_key_name(x["name"]) for x in api["required_parameters"] + api["optional_parameters"]}
        renamed_args += sum(
            1
            for k in p["tool_input"]
            if k in wire and k not in {x["name"] for x in api["required_parameters"] + api["optional_parameters"]}
        )
    assert len(pairs) == 98
    assert renamed_args > 0  # e.g. `is_id` for a doc parameter `id`
