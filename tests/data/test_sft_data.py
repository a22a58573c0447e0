"""The simulator SFT builder: records rendered by the shared prompt code, quality rules counted,
splits that hold out APIs and episodes, and the CLI's behaviour on good and bad input."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
from mirrorapi.prompts.simulator_formats import (
    RESPONSE_CHAR_BUDGET,
    TRUNCATION_MARK,
    simulator_messages,
    truncate_response,
)
from mirrorapi.prompts.simulator_output import is_strict_observation
from mirrorapi.records import canonical_json, observation_json
from mirrorapi.splits import split_episodes
from mirrorapi.tools import ToolRegistry

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples"

SAMPLE_PAIRS = [json.loads(line) for line in open(SAMPLES / "pairs.jsonl", encoding="utf-8")]


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry.load([SAMPLES / "tools"])


def test_records_are_what_the_server_would_send_and_receive(simulator_sft_dir, registry):
    dataset = load_from_disk(str(simulator_sft_dir))
    first_seen = {}
    for p in SAMPLE_PAIRS:
        doc = registry.resolve(p["category"], p["tool_name"], p["api_name"])
        first_seen.setdefault((doc.category, doc.tool, doc.api, canonical_json(p["tool_input"])), p["response"])
    total = 0
    for split in dataset.values():
        for record in split:
            doc = registry.resolve(record["category"], record["tool"], record["api"])
            assert record["prompt"] == simulator_messages(doc, json.loads(record["arguments"]))
            (answer,) = record["completion"]
            assert answer["role"] == "assistant" and is_strict_observation(answer["content"])
            original = first_seen[(record["category"], record["tool"], record["api"], record["arguments"])]
            assert answer["content"] == observation_json(original["error"], truncate_response(original["response"]))
            assert record["prompt_format"] == "mirrorapi-v1"
            total += 1
    stats = json.loads((simulator_sft_dir / "stats.json").read_text())
    assert total == stats["kept"]["total"] == sum(s["records"] for s in stats["splits"].values())
    assert stats["read"]["total"] == len(SAMPLE_PAIRS)
    assert stats["kept"]["error"] > 0 and stats["kept"]["in_band_error"] > 0  # genuine errors are kept


def test_v2_targets_write_json_responses_as_values(registry):
    """mirrorapi-v2: the same records as v1, but a response text holding a JSON object or array is taught as that
    value (the answer parses to the real response's JSON); other responses are taught exactly as in v1."""
    v1, _ = build_simulator_records(SAMPLE_PAIRS, registry, SimulatorDataOptions())
    v2, stats = build_simulator_records(SAMPLE_PAIRS, registry, SimulatorDataOptions(prompt_format="mirrorapi-v2"))
    assert stats["prompt_format"] == "mirrorapi-v2" and v1.keys() == v2.keys()
    structured = 0
    for name in v1:
        for old, new in zip(v1[name], v2[name], strict=True):
            assert new["prompt"] == old["prompt"] and new["prompt_format"] == "mirrorapi-v2"
            old_answer = json.loads(old["completion"][0]["content"])
            new_answer = json.loads(new["completion"][0]["content"])
            assert new_answer["error"] == old_answer["error"]
            response = old_answer["response"]
            try:
                value = json.loads(response) if isinstance(response, str) else None
            except ValueError:
                value = None
            if isinstance(value, (dict, list)):
                assert new_answer["response"] == value
                structured += 1
            else:
                assert new["completion"] == old["completion"]
    assert structured > 0


def test_each_quality_rule_is_applied_and_counted(registry):
    options = SimulatorDataOptions(ood_fraction=0, id_fraction=0)
    _, base = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, options)
    success = next(
        p
        for p in SAMPLE_PAIRS
        if p["source"] == "api-bank-generated" and not p["response"]["error"] and len(p["tool_input"]) > 1
    )
    reordered = copy.deepcopy(success)
    reordered["tool_input"] = dict(reversed(list(success["tool_input"].items())))
    reordered["episode"] = "extra-1"
    conflicting = copy.deepcopy(reordered)
    conflicting["response"] = {"error": "", "response": "something else"}
    rate_limited = copy.deepcopy(success)
    rate_limited["tool_input"] = {**success["tool_input"], "extra": 1}
    rate_limited["response"] = {"error": "Rate limit per minute error...", "response": ""}
    unknown = copy.deepcopy(success)
    unknown["api_name"] = "NoSuchApi"
    long_one = copy.deepcopy(success)
    long_one["tool_input"] = {**success["tool_input"], "page": 2}
    long_one["response"] = {"error": "", "response": "x" * (RESPONSE_CHAR_BUDGET + 500)}
    extra = [reordered, conflicting, rate_limited, unknown, long_one]
    for number, pair in enumerate(extra, 1):  # each its own recorded call: a step read again is a duplicate
        pair["episode"] = f"extra-{number}"

    splits, stats = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS) + extra, registry, options)
    assert stats["dropped"]["duplicate"] == base["dropped"]["duplicate"] + 1
    assert stats["dropped"]["duplicate_conflicting"] == base["dropped"]["duplicate_conflicting"] + 1
    assert (
        stats["dropped"]["transport_failure_by_kind"]["rate_limit"]
        == base["dropped"]["transport_failure_by_kind"].get("rate_limit", 0) + 1
    )
    assert stats["dropped"]["unknown_api"] == base["dropped"]["unknown_api"] + 1
    assert stats["unknown_api_examples"] == ["APIBank/apibank_account/NoSuchApi"] or stats["unknown_api_examples"][
        -1
    ].endswith("/NoSuchApi")
    assert stats["kept"]["total"] == base["kept"]["total"] + 1
    assert stats["kept"]["truncated"] == base["kept"]["truncated"] + 1
    (cut,) = [r for r in splits["train"] if r["arguments"] == canonical_json(long_one["tool_input"])]
    response = json.loads(cut["completion"][0]["content"])["response"]
    assert len(response) == RESPONSE_CHAR_BUDGET + len(TRUNCATION_MARK) and response.endswith(TRUNCATION_MARK)


def test_splits_hold_out_apis_and_whole_episodes(simulator_sft_dir):
    dataset = load_from_disk(str(simulator_sft_dir))

    def apis(split):
        return {(r["category"], r["tool"], r["api"]) for r in dataset[split]}

    def episodes(split):
        return {(r["source"], r["episode"]) for r in dataset[split]}

    assert len(dataset["test_id"]) and len(dataset["test_ood"])
    assert not apis("test_ood") & apis("train")  # out of distribution: never seen in training
    assert apis("test_id") <= apis("train")  # in distribution: seen APIs, unseen calls
    assert not (episodes("test_id") | episodes("test_ood")) & episodes("train")


def test_few_shot_examples_come_from_training_calls_of_the_same_api(registry):
    splits, _ = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(few_shot=2))
    train_calls = {(r["category"], r["tool"], r["api"], r["arguments"]) for r in splits["train"]}
    shown = 0
    for name, records in splits.items():
        for r in records:
            user = r["prompt"][1]["content"]
            if "\n\nExamples:\n" not in user:
                continue
            examples = user.split("\n\nExamples:\n")[1].split("\n\nRequest:\n")[0]
            requests = [line[len("Request: ") :] for line in examples.splitlines() if line.startswith("Request: ")]
            assert 1 <= len(requests) <= 2 and r["arguments"] not in requests
            assert all((r["category"], r["tool"], r["api"], q) in train_calls for q in requests)
            assert name != "test_ood"  # an unseen API has no cached examples
            shown += 1
    assert shown > 100


def test_splits_are_seeded():
    apis = [f"api{i % 23}" for i in range(400)]
    episodes = [f"ep{i // 4}" for i in range(400)]
    first = split_episodes(apis, episodes, 0.1, 0.1, seed=1)
    assert first == split_episodes(apis, episodes, 0.1, 0.1, seed=1)
    assert first != split_episodes(apis, episodes, 0.1, 0.1, seed=2)
    assert sorted(sum(first.values(), [])) == list(range(400))


def run_builder(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "data/build_simulator_sft.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def test_cli_builds_a_loadable_dataset(tmp_path):
    result = run_builder(
        "--pairs", SAMPLES / "pairs.jsonl", "--tools", SAMPLES / "tools", "--out", tmp_path / "d", "--seed", "7"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    dataset = load_from_disk(str(tmp_path / "d"))
    assert {name: len(split) for name, split in dataset.items()} == summary["splits"]
    assert json.loads((tmp_path / "d/stats.json").read_text())["options"]["seed"] == 7


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pairs", "missing.jsonl", "--tools", SAMPLES / "tools"], "pairs file not found: missing.jsonl"),
        (["--pairs", SAMPLES / "tools", "--tools", SAMPLES / "tools"], f"pairs file is a folder: {SAMPLES / 'tools'}"),
        (["--pairs", SAMPLES / "pairs.jsonl", "--tools", "no/such/folder"], "tool source not found: no/such/folder"),
        (["--pairs", SAMPLES / "pairs.jsonl"], "need --tools"),
        (["--pairs", SAMPLES / "pairs.jsonl", "--tools", SAMPLES / "tools", "--ood-fraction", "1.5"], "ood_fraction"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, args, message):
    result = run_builder(*args, "--out", tmp_path / "d")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_an_out_folder_that_is_no_earlier_build_is_refused_and_kept(tmp_path):
    """`--out` replaces the folder when the build succeeds: given the folder holding the pairs (or the tools, or
    `runs`), the inputs were deleted with exit 0. Refused before the build, for both builders; the folder kept."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    pairs = inputs / "pairs.jsonl"
    pairs.write_bytes((SAMPLES / "pairs.jsonl").read_bytes())
    held = run_builder("--pairs", pairs, "--tools", SAMPLES / "tools", "--out", inputs)
    assert held.returncode == 2 and held.stderr.strip().splitlines()[-1].endswith(
        f"--out {inputs} holds the input {pairs}: replacing it would delete that"
    )
    other = tmp_path / "runs"
    (other / "notes").mkdir(parents=True)
    for builder, given in (
        ("build_simulator_sft.py", ["--pairs", pairs, "--tools", SAMPLES / "tools"]),
        ("build_judge_sft.py", ["--labelled", SAMPLES / "judge.jsonl"]),
    ):
        done = subprocess.run(
            [sys.executable, str(REPO / "data" / builder), *map(str, given), "--out", str(other)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and "is a folder of something else" in done.stderr, done.stderr
    assert pairs.read_bytes() == (SAMPLES / "pairs.jsonl").read_bytes() and (other / "notes").is_dir()
    # A file, or a path under a file: found after the whole build was saved, as a raw "[Errno 20] Not a directory:
    # PosixPath(...)" (audit of 2026-12-01); now before it, in words.
    a_file = tmp_path / "existing.txt"
    a_file.write_text("mine")
    for out, says in ((a_file, "is a file, not a folder"), (a_file / "sub", "is a file, not a folder")):
        done = run_builder("--pairs", pairs, "--tools", SAMPLES / "tools", "--out", out)
        assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(says), done.stderr
        assert "stats" not in done.stdout  # refused before the build
    assert a_file.read_text() == "mine"


def test_input_with_no_pair_to_keep_is_refused_and_the_set_it_would_replace_stays(tmp_path):
    """Every line unreadable (`tool_input` kept as a JSON string, as StableToolBench's logs keep it): an empty dataset
    replaced a good one with exit 0, where the judge's builder refused the same case."""
    good = tmp_path / "d"
    assert run_builder("--pairs", SAMPLES / "pairs.jsonl", "--tools", SAMPLES / "tools", "--out", good).returncode == 0
    before = {name: len(split) for name, split in load_from_disk(str(good)).items()}
    as_strings = tmp_path / "strings.jsonl"
    lines = [json.loads(line) for line in (SAMPLES / "pairs.jsonl").read_text().splitlines()[:5]]
    as_strings.write_text("".join(json.dumps({**p, "tool_input": json.dumps(p["tool_input"])}) + "\n" for p in lines))
    done = run_builder("--pairs", as_strings, "--tools", SAMPLES / "tools", "--out", good)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("no pair kept of 0 read; 5 unreadable line(s), e.g. strings.jsonl:1: tool_input is not an object")
    )
    assert {name: len(split) for name, split in load_from_disk(str(good)).items()} == before


def test_long_targets_are_shrunk_to_valid_json_not_dropped(registry):
    """--target-response-chars: a long JSON answer becomes a shorter JSON value of the same shape (its first
    list items, every key), so its record fits a CPU's max_length; short answers are left as they were."""
    bound = 300
    whole, _ = build_simulator_records(SAMPLE_PAIRS, registry, SimulatorDataOptions(prompt_format="mirrorapi-v2"))
    shrunk, _ = build_simulator_records(
        SAMPLE_PAIRS, registry, SimulatorDataOptions(prompt_format="mirrorapi-v2", target_response_chars=bound)
    )
    changed = cut_json = 0
    for split in whole:
        assert len(shrunk[split]) == len(whole[split])
        for before, after in zip(whole[split], shrunk[split], strict=True):
            old = json.loads(before["completion"][0]["content"])["response"]
            new = json.loads(after["completion"][0]["content"])["response"]  # still one JSON observation
            if len(json.dumps(old, separators=(",", ":"), ensure_ascii=False)) <= bound:
                assert new == old
                continue
            changed += 1
            if isinstance(old, str) and isinstance(new, (list, dict)):
                cut_json += 1  # without the option, JSON over the server's budget was cut into a string
                assert old.endswith(TRUNCATION_MARK) and len(json.dumps(new, separators=(",", ":"))) < len(old) / 2
                continue
            assert type(new) is type(old)
            if isinstance(old, dict):
                assert set(new) == set(old)
            elif isinstance(old, list):
                assert 1 <= len(new) <= len(old)
    assert changed > cut_json > 0


def test_stateless_too_renders_each_distinct_call_once_without_history_in_the_same_split(registry):
    """--stateless-too: beside every session record, each distinct call of a split once in the stateless format,
    the first in input order, with the same few-shot examples and the same split (no episode crosses splits). An
    episode's first call has no earlier call to show: with or without the flag it is rendered in the stateless
    format (as the server asks it), and never twice."""
    session_only, _ = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS),
        registry,
        SimulatorDataOptions(prompt_format="mirrorapi-session-v2", history=8, few_shot=1),
    )
    both, stats = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS),
        registry,
        SimulatorDataOptions(prompt_format="mirrorapi-session-v2", history=8, few_shot=1, stateless_too=True),
    )
    firsts = 0

    def call(record: dict) -> tuple:
        return record["category"], record["tool"], record["api"], record["arguments"]

    trained = {call(r) for r in both["train"]}
    for split, records in both.items():
        session = [r for r in records if r["prompt_format"] == "mirrorapi-session-v2"]
        alone = [r for r in records if r["prompt_format"] == "mirrorapi-v2"]
        assert len(session) + len(alone) == len(records)
        assert session == [r for r in session_only[split] if r["prompt_format"] == "mirrorapi-session-v2"]
        first_calls = [r for r in session_only[split] if r["prompt_format"] == "mirrorapi-v2"]
        assert all(r in alone for r in first_calls)
        assert not any("(none)" in r["prompt"][1]["content"] for r in session)
        assert all(r in first_calls for r in session_only[split] if r["step"] == 0)  # nothing before step 0
        firsts += len(first_calls)
        keys = [call(r) for r in alone]
        # Every call of the split once, but a held-out split's training calls (a server's cache hits, and rendered
        # without history the training record itself) only where an episode's first call is one.
        expected = {call(r) for r in records if split == "train" or call(r) not in trained or r in first_calls}
        assert len(keys) == len(set(keys)) and set(keys) == expected
        assert all(r["call_in_train"] == (call(r) in trained) for r in records)
        for r in alone:
            system, user = r["prompt"]
            assert "Earlier calls in this session" not in user and "session" not in system["content"]
        assert stats["splits"][split]["by_prompt_format"] == {
            "mirrorapi-session-v2": len(session),
            "mirrorapi-v2": len(alone),
        }
    assert firsts
    first = next(p for p in SAMPLE_PAIRS if p["source"] == "api-bank-generated")
    doc = registry.resolve(first["category"], first["tool_name"], first["api_name"])
    (record,) = [
        r
        for records in both.values()
        for r in records
        if r["prompt_format"] == "mirrorapi-v2"
        and (r["api"], r["arguments"]) == (doc.api, canonical_json(first["tool_input"]))
    ]
    assert record["prompt"][1]["content"].endswith("Request:\n" + canonical_json(first["tool_input"]))


def test_repeat_sources_repeats_training_records_only(registry):
    plain, _ = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions())
    repeated, stats = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(repeat_sources=["tau-bench=3"])
    )
    taus = [r for r in plain["train"] if r["source"] == "tau-bench"]
    assert taus and len(repeated["train"]) == len(plain["train"]) + 2 * len(taus)
    assert [r for r in repeated["train"] if r["source"] == "tau-bench"] == [r for r in taus for _ in range(3)]
    assert repeated["test_id"] == plain["test_id"] and repeated["test_ood"] == plain["test_ood"]
    assert stats["splits"]["train"]["by_source"]["tau-bench"] == 3 * len(taus)


def test_repeat_failures_repeats_failed_training_calls_on_top_of_their_source(registry):
    plain, _ = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions())
    options = SimulatorDataOptions(repeat_failures=2, repeat_sources=["tau-bench=3"])
    repeated, stats = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, options)
    # a failure is a pair whose real answer has an error field (the shared data's own field), but ToolBench's
    # "Message error...", which its executor writes for any response holding the word (tests/data/test_sft_quality.py)
    failed = {
        (p["source"], str(p["episode"]), int(p["step"]))
        for p in SAMPLE_PAIRS
        if p["response"].get("error") and p["response"]["error"] != "Message error..."
    }
    times = {"success": 1, "error": 2, "in_band_error": 2}
    expected = [r for r in plain["train"] for _ in range(times[r["kind"]] * (3 if r["source"] == "tau-bench" else 1))]
    assert any((r["source"], r["episode"], r["step"]) in failed for r in plain["train"])
    assert {r["kind"] for r in plain["train"] if (r["source"], r["episode"], r["step"]) in failed} == {"error"}
    assert repeated["train"] == expected and len(expected) > len(plain["train"])
    assert repeated["test_id"] == plain["test_id"] and repeated["test_ood"] == plain["test_ood"]
    assert stats["splits"]["train"]["error"] == 2 * sum(
        (3 if r["source"] == "tau-bench" else 1) for r in plain["train"] if r["kind"] == "error"
    )


def test_without_examples_share_hides_the_examples_of_that_share_of_training_calls_only(registry):
    def examples_shown(records):
        return [("\n\nExamples:\n" in r["prompt"][1]["content"]) for r in records]

    options = {"few_shot": 1, "history": 2, "prompt_format": "mirrorapi-session-v2", "stateless_too": True}
    plain, _ = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(**options))
    hidden, stats = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(without_examples_share=0.5, **options)
    )
    assert hidden["test_id"] == plain["test_id"] and hidden["test_ood"] == plain["test_ood"]
    assert stats["options"]["without_examples_share"] == 0.5
    shown, now = examples_shown(plain["train"]), examples_shown(hidden["train"])
    assert len(shown) == len(now) and not any(n and not s for s, n in zip(shown, now, strict=True))
    lost = sum(s and not n for s, n in zip(shown, now, strict=True))
    assert 0.3 * sum(shown) < lost < 0.7 * sum(shown)
    # a hidden record is the same record without its examples: the prompt a server sends for an API it has no call of
    for before, after in zip(plain["train"], hidden["train"], strict=True):
        if before["prompt"] != after["prompt"]:
            head, rest = before["prompt"][1]["content"].split("\n\nExamples:\n")
            assert after["prompt"][1]["content"] == head + rest[rest.index("\n\n") :]
            assert after["completion"] == before["completion"]
    again, _ = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(without_examples_share=0.5, **options)
    )
    assert again == hidden  # drawn with the seed


def test_test_ood_shown_asks_unseen_apis_calls_with_examples_from_other_held_out_episodes(registry):
    """A server whose cache holds recorded calls of an API the simulator never trained on shows them as examples:
    test_ood_shown asks half of test_ood's episodes so, the examples drawn from the other half's real answers."""
    # besides the sample's own, logins of one user in eight more episodes of a held-out API (GetUserToken): each
    # one's most similar call is another of them, in either half
    pairs = SAMPLE_PAIRS + [
        {
            "source": "api-bank-generated",
            "episode": f"extra-{k}",
            "step": 0,
            "category": "APIBank",
            "tool_name": "apibank_account",
            "api_name": "GetUserToken",
            "tool_input": {"username": "zed", "password": f"pw{k}"},
            "response": {"error": "The password is incorrect." if k % 2 else "", "response": "" if k % 2 else f"t{k}"},
        }
        for k in range(8)
    ]
    options = {"few_shot": 1, "history": 2, "prompt_format": "mirrorapi-session-v2", "stateless_too": True}
    plain, _ = build_simulator_records(copy.deepcopy(pairs), registry, SimulatorDataOptions(**options))
    shown, stats = build_simulator_records(
        copy.deepcopy(pairs), registry, SimulatorDataOptions(test_ood_shown=True, **options)
    )
    assert {k: v for k, v in shown.items() if k != "test_ood_shown"} == plain
    assert stats["splits"]["test_ood_shown"]["records"] == len(shown["test_ood_shown"]) > 0

    def episode(record):
        return record["source"], record["episode"]

    asked = {episode(r) for r in shown["test_ood_shown"]}
    ood_calls = {(episode(r), r["api"], r["arguments"]) for r in plain["test_ood"]}
    assert asked < {episode(r) for r in plain["test_ood"]}  # a part of test_ood's episodes, whole episodes
    assert {(episode(r), r["api"], r["arguments"]) for r in shown["test_ood_shown"]} == {
        c for c in ood_calls if c[0] in asked
    }
    # every example shown is a real answer of the same API, from a test_ood episode outside the asked half
    answers = {}
    for p in pairs:
        doc = registry.resolve(p["category"], p["tool_name"], p["api_name"])
        if ((p["source"], str(p["episode"])), doc.api, canonical_json(p["tool_input"])) in ood_calls:
            answers.setdefault((doc.api, canonical_json(p["tool_input"])), set()).add((p["source"], str(p["episode"])))
    with_example = 0
    for record in shown["test_ood_shown"]:
        text = record["prompt"][1]["content"]
        if "\n\nExamples:\n" not in text:
            continue
        with_example += 1
        request = json.loads(text.split("\n\nExamples:\nRequest: ")[1].split("\n")[0])
        pool_episodes = answers[(record["api"], canonical_json(request))]
        assert pool_episodes and not pool_episodes & asked
    assert with_example >= len(shown["test_ood_shown"]) // 2
    # test_ood itself stays asked as for an API with no recorded call: no example
    assert not any("\n\nExamples:\n" in r["prompt"][1]["content"] for r in plain["test_ood"])
    extras = [r for r in shown["test_ood_shown"] if r["episode"].startswith("extra-")]
    assert extras and all('"username":"zed"' in r["prompt"][1]["content"].split("Examples:")[1] for r in extras)
    again, _ = build_simulator_records(
        copy.deepcopy(pairs), registry, SimulatorDataOptions(test_ood_shown=True, **options)
    )
    assert again == shown  # drawn with the seed


@pytest.mark.parametrize(
    "options, message",
    [
        ({"repeat_failures": 0}, "repeat_failures must be >= 1"),
        ({"repeat_sources": ["tau-bench"]}, "SOURCE=N"),
        ({"repeat_sources": ["tau-bench=0"]}, "SOURCE=N"),
        ({"stateless_too": True}, "needs history > 0"),
        ({"without_examples_share": 1.0}, "without_examples_share must be in"),
        ({"test_ood_shown": True}, "needs few_shot > 0"),
    ],
)
def test_bad_mixing_options_are_refused(registry, options, message):
    with pytest.raises(ValueError, match=message):
        build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, SimulatorDataOptions(**options))


def test_no_held_out_record_left_in_an_evaluation_is_a_training_record(registry, tmp_path):
    """With history and --stateless-too, a call made in a training episode and again in a held-out one (API-Bank's
    logins, tokens) was rendered without history in both splits: the same prompt and answer, 552 times in test_id
    of the shared data. Held-out stateless records now leave training calls out, and every record says whether its
    call is a training call (`call_in_train`: the eval loss leaves those out, as a server answers them from its
    cache)."""
    splits, stats = build_simulator_records(
        copy.deepcopy(SAMPLE_PAIRS),
        registry,
        SimulatorDataOptions(prompt_format="mirrorapi-session-v2", history=8, few_shot=1, stateless_too=True),
    )

    def text(record: dict) -> str:
        return json.dumps([record["prompt"], record["completion"]], sort_keys=True)

    trained = {text(r) for r in splits["train"]}
    evaluated = [r for name in ("test_id", "test_ood") for r in splits[name] if not r["call_in_train"]]
    assert evaluated and not any(text(r) in trained for r in evaluated)
    assert stats["stateless_held_out_calls_in_train"] > 0  # the samples have such calls: the case is exercised
    stateless = [r for r in splits["test_id"] if r["prompt_format"] == "mirrorapi-v2" and r["step"] > 0]
    assert not any(r["call_in_train"] for r in stateless)
    # And so on disk, where the recipes read it (`training_splits` leaves out the records that say so): the column
    # was once dropped when the dataset was written, and every held-out record was evaluated.
    on_disk = load_from_disk(str(write_sft_dataset(tmp_path / "d", splits, stats)))
    for name in ("test_id", "test_ood"):
        assert on_disk[name]["call_in_train"] == [r["call_in_train"] for r in splits[name]]
    assert any(on_disk["test_id"]["call_in_train"]) and all(on_disk["train"]["call_in_train"])


def test_a_build_whose_train_split_is_empty_says_so(registry, tmp_path, caplog):
    """Data too small to split (a few episodes, their APIs held out whole) is written, and said to have nothing to
    train on (it was only visible in stats.json)."""
    pairs = [json.loads(line) for line in (SAMPLES / "pairs.jsonl").read_text().splitlines()]
    splits, stats = build_simulator_records(pairs, registry, SimulatorDataOptions())
    held_out = {"train": [], "test_id": splits["test_id"] + splits["train"], "test_ood": splits["test_ood"]}
    write_sft_dataset(tmp_path / "d", held_out, stats)
    assert any("the train split is empty" in r.getMessage() for r in caplog.records)
    caplog.clear()
    write_sft_dataset(tmp_path / "e", splits, stats)
    assert not any("the train split is empty" in r.getMessage() for r in caplog.records)


def test_a_byte_order_mark_does_not_cost_the_first_pair(tmp_path):
    """A file saved by a Windows editor starts with a BOM, which RFC 8259 §8.1 lets a reader ignore; the first pair
    was "not JSON" and lost from the dataset, with exit 0."""
    from mirrorapi.records import read_pairs_jsonl

    with_bom = tmp_path / "bom.jsonl"
    with_bom.write_bytes(b"\xef\xbb\xbf" + (SAMPLES / "pairs.jsonl").read_bytes())
    bad: list[str] = []
    assert list(read_pairs_jsonl(with_bom, bad.append)) == SAMPLE_PAIRS and bad == []


def test_a_pairs_file_given_twice_builds_the_same_records(registry):
    """A file given twice (or files that overlap): each step read again was shown as an earlier call of its own
    episode, so with history every prompt listed each earlier call twice (the data stage's stats said nothing)."""
    options = SimulatorDataOptions(prompt_format="mirrorapi-session-v1", history=4)
    once, once_stats = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS), registry, options)
    twice, twice_stats = build_simulator_records(copy.deepcopy(SAMPLE_PAIRS + SAMPLE_PAIRS), registry, options)
    assert twice == once
    assert twice_stats["dropped"]["duplicate"] == once_stats["dropped"]["duplicate"] + len(SAMPLE_PAIRS)


def test_a_dataset_folder_is_made_as_a_plain_folder_would_be(tmp_path):
    """The folder is built as a `tempfile.mkdtemp` staging folder (0700) and renamed into place, so every other user
    (a shared machine's training job) was refused it (audit of 2026-12-01). It takes the umask's mode."""
    import os

    records = [{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}]
    out = write_sft_dataset(tmp_path / "set", {"train": records}, {"kind": "simulator"}, ["prompt", "completion"])
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_pair_nested_500_deep_is_one_unreadable_line_of_a_build(tmp_path, capsys):
    """Its `tool_input` 500 deep: a RecursionError traceback, exit 1, and no dataset (audit of the data stage)."""
    from mirrorapi.cli import main

    deep = json.dumps(SAMPLE_PAIRS[0] | {"tool_input": "DEEP"})
    deep = deep.replace('"DEEP"', '{"a": ' + "[" * 499 + "]" * 499 + "}")  # json.dumps stops short of such depths
    (tmp_path / "one.jsonl").write_text(deep + "\n", encoding="utf-8")
    given = ["--pairs", tmp_path / "one.jsonl", SAMPLES / "pairs.jsonl", "--tools", SAMPLES / "tools"]
    assert main(["data", "build-simulator-sft", *map(str, given), "--out", str(tmp_path / "d")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["dropped"]["unreadable"] == 1


def test_unreadable_lines_are_said_on_stderr_not_only_counted(tmp_path):
    """Bad lines were dropped with nothing on stderr: only `"unreadable": N` in the JSON summary on stdout."""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("not json\n" + (SAMPLES / "pairs.jsonl").read_text() + '{"source": "x"}\n', encoding="utf-8")
    done = run_builder("--pairs", mixed, "--tools", SAMPLES / "tools", "--out", tmp_path / "d")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert warnings == ["WARNING mirrorapi.data.commands: 2 unreadable line(s) skipped, e.g. mixed.jsonl:1: not JSON"]
    assert json.loads(done.stdout.strip().splitlines()[-1])["dropped"]["unreadable"] == 2
