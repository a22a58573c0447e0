"""`python eval/simulator.py`: replaying real held-out calls through a real virtual server, and the metrics."""

import asyncio
import itertools
import json
import math
import time
from collections import defaultdict

import pytest
from fastapi import FastAPI, Request

from harness.processes import free_port, serve_in_thread
from mirrorapi.evaluation.fidelity.metrics import (
    answered_from_cache,
    api_id,
    compare,
    conforms,
    difference_text,
    is_error,
    paired_difference,
    payload_text,
    slice_metrics,
)
from mirrorapi.evaluation.fidelity.replay import NearestExample, load_pairs, replay
from mirrorapi.prompts.simulator_formats import response_schema, skeleton_schema
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.tools import ToolRegistry

SOURCES = ("api-bank", "api-bank-generated", "tau-bench", "toolbench-example")


@pytest.fixture(scope="module")
def sample_pairs(samples):
    return load_pairs([samples / "pairs.jsonl"])


@pytest.fixture(scope="module")
def registry(samples):
    return ToolRegistry.load([samples / "tools"])


def _episodes(pairs):
    episodes = defaultdict(list)
    for pair in pairs:
        episodes[(pair["source"], pair["episode"])].append(pair)
    return episodes


def _split(pairs, per_source: int, max_calls: int):
    """Held out: the first episodes (by name) of each source with at most `max_calls` calls; the rest: training."""
    episodes, held = _episodes(pairs), set()
    for source in SOURCES:
        names = sorted(k for k, calls in episodes.items() if k[0] == source and len(calls) <= max_calls)
        held.update(names[:per_source])
    held_out = [p for p in pairs if (p["source"], p["episode"]) in held]
    return held_out, [p for p in pairs if (p["source"], p["episode"]) not in held]


def _write(path, pairs):
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def _one_api(responses: list[dict], source: str = "api-bank", category: str = "APIBank") -> list[dict]:
    """Pairs of one API, a call per real answer, in step order, each call an episode of its own (the intervals
    resample episodes)."""
    return [
        {
            "source": source,
            "episode": f"e{i}",
            "step": i,
            "category": category,
            "tool_name": "t",
            "api_name": "a",
            "tool_input": {"i": i},
            "response": response,
        }
        for i, response in enumerate(responses)
    ]


def test_template_skeletons_check_real_responses(registry, sample_pairs):
    doc = registry.resolve("APIBank", "apibank_lv3_location", "NearbyRestaurants")
    schema = response_schema(doc)
    assert schema == skeleton_schema(doc.template_response)
    assert schema["properties"]["restaurants"]["items"]["required"] == ["coordinates", "name"]
    real = next(p for p in sample_pairs if p["api_name"] == "NearbyRestaurants" and not p["response"]["error"])
    assert conforms(schema, real["response"]["response"])  # a JSON string holding the documented object
    assert conforms(schema, json.loads(real["response"]["response"]))  # the object itself (a simulator may send one)
    assert not conforms(schema, '{"restaurants": [{"name": "Restaurant A"}]}')  # `coordinates` missing
    assert not conforms(schema, "Restaurant A, Restaurant B")
    # ToolBench's Python-repr text is read as the literal it is.
    assert conforms(skeleton_schema({"status": "str"}), "{'status': 'success'}")


def test_valid_json_and_schema_conformance_score_the_simulated_answers_not_the_real_ones(registry):
    """docs/evaluation.md: valid JSON is, over the calls whose real response is a JSON object/array, the share whose
    simulated response is one too; schema conformance is, over the successful real calls of an API with a
    documented response schema, the share whose simulated response conforms (the real responses' own share apart,
    the ceiling). Here the real and simulated answers differ, so a metric that counted the real side would show."""
    fits = '{"restaurants": [{"coordinates": [40.7128, 74.006], "name": "Restaurant A"}]}'
    real = [
        {"error": "", "response": fits},
        {"error": "", "response": fits},
        {"error": "", "response": fits},
        {"error": "", "response": "No restaurants nearby."},  # a success, but neither JSON nor the documented object
        {"error": "Invalid coordinates.", "response": ""},  # a failure: in neither share
    ]
    simulated = [
        {"error": "", "response": fits},  # JSON, conforms
        {"error": "", "response": '{"restaurants": [{"name": "Restaurant A"}]}'},  # JSON, `coordinates` missing
        {"error": "", "response": "Restaurant A, Restaurant B"},  # not JSON, does not conform
        {"error": "", "response": fits},  # JSON where the real one is not (outside valid JSON's calls), conforms
        {"error": "", "response": fits},  # answers a failed call: outside both
    ]
    pairs = [dict(p, tool_name="apibank_lv3_location", api_name="NearbyRestaurants") for p in _one_api(real)]
    metrics = slice_metrics(compare(pairs, simulated, registry=registry), "simulated")
    # valid JSON: real JSON on calls 0, 1, 2; the simulator's is JSON on 0 and 1.
    assert (metrics["valid_json_n"], metrics["valid_json"]) == (3, pytest.approx(200 / 3))
    # schema: successful real calls 0, 1, 2, 3; the simulator conforms on 0 and 3, the real answers on 0, 1 and 2.
    assert metrics["schema_n"] == 4
    assert (metrics["schema_conformance"], metrics["schema_conformance_real"]) == (50.0, 75.0)


def test_errors_include_tau_bench_in_band_replies(sample_pairs):
    in_band = next(p for p in sample_pairs if p["response"]["response"].startswith("Error:"))
    assert in_band["response"]["error"] == "" and is_error(in_band["response"])
    assert is_error({"error": "The token is invalid.", "response": ""})
    assert not is_error({"error": "", "response": '{"status": "success"}'})
    assert payload_text({"error": "", "response": {"a": 1}}) == '{"a": 1}'
    assert payload_text({"error": "Bad date", "response": ""}) == "Bad date"


def test_nearest_example_is_the_closest_call_of_the_same_api(sample_pairs):
    by_api = defaultdict(list)
    for pair in sample_pairs:
        by_api[api_id(pair)].append(pair)
    target = next(p for p in sample_pairs if len(by_api[api_id(p)]) >= 3)
    others = [p for p in by_api[api_id(target)] if p is not target]
    # The held-out call itself is in the training list: it must not be its own baseline.
    baseline = NearestExample(sample_pairs, [target])
    assert baseline(target) in [p["response"] for p in others]
    # The same arguments in another episode beat every other call of the API (ties: the earliest).
    copy = dict(target, episode="copy-of-" + target["episode"], response={"error": "", "response": "the copy"})
    assert NearestExample([copy] + sample_pairs, [target])(target) == copy["response"]
    assert baseline(dict(target, api_name="NoSuchApi")) is None


def test_the_nearest_example_is_the_call_that_shares_the_most_argument_values():
    """Three training calls of one API, none with the held-out call's exact arguments: the one sharing two of its
    three values is its baseline, not the earliest one (which shares only the names) nor the one sharing one value."""
    held = {"city": "Paris", "days": 3, "units": "metric"}
    train = [
        {"city": "London", "days": 5, "units": "imperial"},  # the same names, no value
        {"city": "Paris", "days": 3, "units": "imperial"},  # two values of three
        {"city": "Paris", "days": 7},  # one value
    ]
    pairs = [
        dict(p, tool_input=args)
        for p, args in zip(_one_api([{"error": "", "response": f"call {i}"} for i in range(3)]), train, strict=True)
    ]
    target = dict(pairs[0], episode="held", tool_input=held, response={"error": "", "response": "real"})
    assert NearestExample(pairs, [target])(target) == {"error": "", "response": "call 1"}


# Four real calls, two of which failed (one with an error field, one with tau-bench's in-band "Error: ...").
FOUR_REAL_CALLS = [
    {"error": "The token is invalid.", "response": ""},
    {"error": "", "response": "Error: no such user"},
    {"error": "", "response": "ok"},
    {"error": "", "response": "ok"},
]


def test_error_precision_and_recall_count_the_calls_they_are_over():
    real = FOUR_REAL_CALLS
    pairs = _one_api(real)
    # The simulator catches the first failure, misses the second, and fails one call that worked.
    simulated = [
        {"error": "bad token", "response": ""},
        {"error": "", "response": "fine"},
        {"error": "", "response": "Error: made up"},
        {"error": "", "response": "ok"},
    ]
    metrics = slice_metrics(compare(pairs, simulated), "simulated")
    assert metrics["errors"] == {"both": 1, "real_only": 1, "simulated_only": 1, "neither": 1, "no_answer": 0}
    assert (metrics["error_precision"], metrics["error_precision_n"]) == (50.0, 2)
    assert (metrics["error_recall"], metrics["error_recall_n"]) == (50.0, 2)
    assert metrics["error_agreement"] == 50.0
    # A side that never answers an error has no precision (n/a, not 0) and no recall.
    never = slice_metrics(compare(pairs, [{"error": "", "response": "ok"}] * 4), "simulated")
    assert (never["error_precision"], never["error_precision_n"], never["error_recall"]) == (None, 0, 0.0)
    # Each with its bootstrap interval over the four calls: wide here; none where no resample has such a call.
    for key in ("error_precision", "error_recall"):
        low, high = metrics[f"{key}_ci95"]
        assert low < metrics[key] < high
    assert (never["error_precision_ci95"], never["error_recall_ci95"]) == (None, [0.0, 0.0])
    exact = slice_metrics(compare(pairs, real), "simulated")  # every failure caught, none made up
    assert (exact["error_precision_ci95"], exact["error_recall_ci95"]) == ([100.0, 100.0], [100.0, 100.0])


def test_no_answer_is_no_failure_of_the_api():
    """A request that failed, or the server's simulator failure (StableToolBench's `Failed to generate fake
    response`: its placeholder when the model wrote no observation, transport_failures.py), says nothing of whether
    the API fails: a server that answers nothing must not score error recall, nor agreement on the real failures."""
    pairs = _one_api(FOUR_REAL_CALLS)
    down = [{"error": "HTTP 503: unavailable", "response": "", "failed": True}] * 4
    placeholder = [{"error": "Failed to generate fake response", "response": ""}] * 4
    for unanswered in (down, placeholder):
        metrics = slice_metrics(compare(pairs, unanswered), "simulated")
        assert metrics["error_agreement"] == 0.0 and metrics["error_recall"] == 0.0
        # no error answer at all: no precision (n/a), the real failures missed, the successes not answered
        assert (metrics["error_precision"], metrics["error_precision_n"]) == (None, 0)
        assert metrics["errors"] == {"both": 0, "real_only": 2, "simulated_only": 0, "neither": 0, "no_answer": 2}


def test_bleu4_gives_its_length_and_brevity_penalty_apart():
    """BLEU (Papineni et al., 2002): the n-gram precisions' geometric mean times BP = exp(1 - r/c) for a candidate
    length c under the reference length r, else 1. Answers that are the real ones' first words have every
    precision 1, so BLEU-4 is BP alone: 16 of 20 words, BP = exp(1 - 20/16) = 77.88%."""
    words = [f"word{i}" for i in range(20)]
    pairs = _one_api([{"error": "", "response": " ".join(words[step * 10 : step * 10 + 10])} for step in range(2)])
    simulated = [{"error": "", "response": " ".join(words[step * 10 : step * 10 + 8])} for step in range(2)]
    short = slice_metrics(compare(pairs, simulated), "simulated")
    assert short["bleu4_length"] == 80.0
    assert short["bleu4_brevity_penalty"] == pytest.approx(100 * math.exp(1 - 20 / 16), abs=0.01)
    assert short["bleu4"] == pytest.approx(short["bleu4_brevity_penalty"], abs=0.01)
    # Writing more than the real answer costs precision, never a penalty.
    longer = [{"error": "", "response": p["response"]["response"] + " extra words"} for p in pairs]
    long = slice_metrics(compare(pairs, longer), "simulated")
    assert (long["bleu4_length"], long["bleu4_brevity_penalty"]) == (120.0, 100.0)
    assert long["bleu4"] < 100.0


def test_the_simulator_against_the_example_comes_with_a_bootstrap_interval():
    """Twelve calls: the simulator answers half of them as the API did and misses the rest; the example gets one of
    those six right and misses the rest. The difference is what the two sides' own scores say; the interval holds
    it, is wider than a point where the sides differ call by call, and is one point (0) where the two sides are the
    same answers."""
    real = [{"error": "", "response": f"order {i} shipped to city {i} on day {i}"} for i in range(12)]
    pairs = _one_api(real, "tau-bench", "TauBench")
    simulated = [real[i] if i % 2 else {"error": "", "response": "nothing"} for i in range(12)]
    example = {1: real[1]}
    rows = compare(pairs, simulated, baseline=lambda pair: example.get(pair["step"], {"error": "", "response": "no"}))
    gap = paired_difference(rows, rows)
    ours, theirs = slice_metrics(rows, "simulated"), slice_metrics(rows, "baseline")
    for metric in ("bleu4", "rouge_l"):
        assert gap[metric]["difference"] == pytest.approx(ours[metric] - theirs[metric], abs=0.02)
        low, high = gap[metric]["ci95"]
        assert low < gap[metric]["difference"] < high
    # Five calls where only the simulator is right: a resample holds none of them about once in 650 ((7/12)^12).
    assert gap["rouge_l"]["ci95"][0] > 0 and gap["bleu4"]["ci95"][0] > 0
    # The same answers on both sides: no difference, in any resample (sacrebleu's paired test gives such a pair
    # its smallest p-value).
    rows = compare(pairs, simulated, baseline=lambda pair: simulated[pair["step"]])
    same = paired_difference(rows, rows)
    assert same["bleu4"] == same["rouge_l"] == {"difference": 0.0, "ci95": [0.0, 0.0]}


def test_the_intervals_resample_episodes_whole():
    """A cluster bootstrap (Davison & Hinkley 1997, §3.8): where an episode's calls are alike, its calls are one
    draw, not several. Six episodes of four identical calls each (the simulator right on three of them) must give
    exactly the intervals of the six episodes as one call each, which calls resampled one by one would narrow
    (24 draws for 6); calls all of one episode give no interval."""
    real = [
        {"error": "The token is invalid." if i % 3 == 0 else "", "response": f"answer {i} of the API"}
        for i in range(6)
    ]
    wrong = [{"error": "", "response": "something else entirely"} for _ in range(6)]
    simulated = [real[i] if i % 2 else wrong[i] for i in range(6)]
    simulated[4] = {"error": "made up", "response": ""}  # errors: 0 and 3 real, 3 and 4 answered
    alone = compare(_one_api(real), simulated, baseline=lambda pair: wrong[pair["step"]])
    copies = _one_api([r for r in real for _ in range(4)])
    for pair in copies:
        pair["episode"] = f"e{pair['step'] // 4}"
    episodes = compare(
        copies, [s for s in simulated for _ in range(4)], baseline=lambda pair: wrong[pair["step"] // 4]
    )
    gap_alone, gap_episodes = paired_difference(alone, alone), paired_difference(episodes, episodes)
    for metric in ("rouge_l", "bleu4"):
        assert gap_episodes[metric] == gap_alone[metric]
        low, high = gap_alone[metric]["ci95"]
        assert low < gap_alone[metric]["difference"] < high
    found_alone, found_episodes = slice_metrics(alone, "simulated"), slice_metrics(episodes, "simulated")
    for key in ("error_precision_ci95", "error_recall_ci95"):
        assert found_episodes[key] == found_alone[key] and found_alone[key][0] < found_alone[key][1]
    assert (gap_episodes["resampled"], gap_alone["resampled"]) == ("6 episodes", "6 episodes")

    for pair in copies:
        pair["episode"] = "one"
    one = compare(copies, [s for s in simulated for _ in range(4)], baseline=lambda pair: wrong[pair["step"] // 4])
    gap, found = paired_difference(one, one), slice_metrics(one, "simulated")
    assert gap["rouge_l"]["ci95"] is gap["bleu4"]["ci95"] is None
    assert found["error_precision_ci95"] is found["error_recall_ci95"] is None
    assert difference_text(gap).startswith(f"ROUGE-L {gap['rouge_l']['difference']:+.1f} [no interval: one episode]")


def test_a_call_answered_from_the_cache_is_told_apart_by_the_server_s_own_outcome():
    assert answered_from_cache({"outcome": "hit", "provenance": "imported:tool_response_cache"})
    assert answered_from_cache({"outcome": "hit", "provenance": "real"})
    # The simulator's own earlier answer to the same call is the simulator's.
    assert not answered_from_cache({"outcome": "hit", "provenance": "simulated:m@mirrorapi-v2,temperature=0"})
    assert not answered_from_cache({"outcome": "simulated", "provenance": "simulated:m@mirrorapi-v2"})
    assert not answered_from_cache({"outcome": "validation_error", "provenance": None})
    assert not answered_from_cache({"error": "", "response": "ok"})  # a server that does not say


def test_a_missing_baseline_is_wrong_on_every_check_even_where_the_real_answer_is_empty():
    # Real ToolBench calls whose API answered nothing (an empty response), and one with an answer.
    pairs = [
        {
            "source": "toolbench-example",
            "episode": "e",
            "step": step,
            "category": "Logistics",
            "tool_name": "squake",
            "api_name": "checkhealth",
            "tool_input": {},
            "response": response,
        }
        for step, response in enumerate(
            [
                {"error": "", "response": ""},
                {"error": "", "response": ""},
                {"error": "", "response": "{'status': 'ok'}"},
            ]
        )
    ]
    simulated = [{"error": "", "response": ""}, {"error": "", "response": "ok"}, {"error": "", "response": "x"}]
    rows = compare(pairs, simulated, baseline=lambda pair: None)  # no training call of this API
    baseline = slice_metrics(rows, "baseline")
    assert baseline["rouge_l"] == 0.0 and baseline["error_agreement"] == 0.0
    # no example is no error answer: none counted for precision (it was 3 "error answers" until 2026-11-30)
    assert (baseline["error_precision"], baseline["error_precision_n"], baseline["errors"]["no_answer"]) == (
        None,
        0,
        3,
    )
    # The simulator's empty answer to an empty real answer is a full match; "ok" is none.
    assert [row["simulated_rouge_l"] for row in rows[:2]] == [1.0, 0.0]


@pytest.mark.slow
def test_replay_through_a_fresh_server_in_episode_order(
    eval_cli, virtual_server, tiny_engine, sample_pairs, samples, tmp_path
):
    held_out, train = _split(sample_pairs, per_source=1, max_calls=4)
    assert {p["source"] for p in held_out} == set(SOURCES)
    url, request_log = virtual_server(tiny_engine.base_url, tiny_engine.model)
    out = tmp_path / "report"
    argv = [
        "--pairs",
        str(_write(tmp_path / "heldout.jsonl", held_out)),
        "--server",
        url,
        "--out",
        str(out),
        "--baseline-pairs",
        str(_write(tmp_path / "train.jsonl", train)),
        "--tools",
        str(samples / "tools"),
        "--concurrency",
        "1",
        "--no-progress",
    ]
    assert eval_cli("simulator")(argv) == 0

    # One episode at a time: the server saw the calls in (source, episode, step) order.
    lines = [line for line in request_log.read_text().splitlines() if "{" in line]
    seen = [json.loads(line[line.index("{") :])["api"] for line in lines]  # one JSON object per request
    assert seen == ["/".join(api_id(p)) for p in held_out]

    report = json.loads((out / "fidelity.json").read_text())
    assert report["calls"] == len(held_out) and report["cache_entries_at_start"] == 0 and report["baseline"]
    # A fresh cache answers nothing: every call was the simulator's (or refused by the server's checks).
    assert report["cache_hits"]["n"] == 0 and report["scored"] == len(held_out)
    assert sum(report["outcomes"].values()) == len(held_out) and "hit" not in report["outcomes"]
    assert set(report["per_source"]) == set(SOURCES)
    assert {s: b["n"] for s, b in report["per_source"].items()} == {
        s: sum(p["source"] == s for p in held_out) for s in SOURCES
    }
    assert sum(b["n"] for b in report["per_api"].values()) == len(held_out)
    for block in [report["overall"], *report["per_source"].values()]:
        for side in ("simulated", "baseline"):
            metrics = block[side]
            assert metrics["n"] == block["n"]
            assert all(0 <= metrics[k] <= 100 + 1e-9 for k in ("bleu4", "rouge_l", "error_agreement"))  # unrounded
            assert sum(metrics["errors"].values()) == block["n"]
    rows = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert [(r["episode"], r["step"], r["real"]) for r in rows] == [
        (p["episode"], p["step"], p["response"]) for p in held_out
    ]
    assert all(isinstance(r["simulated"]["error"], str) and not r["request_failed"] for r in rows)
    assert (out / "fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "fidelity.md").read_text()
    assert "| simulator |" in markdown and "| nearest example |" in markdown and "## Per API" in markdown


@pytest.mark.slow
def test_identical_answers_score_full_marks_and_a_used_cache_is_flagged(
    eval_cli, virtual_server, tiny_model_dir, sample_pairs, registry, samples, tmp_path
):
    # The held-out calls' real answers are put into the server's cache before it starts, and the server
    # only replays its cache: every answer it gives is the real one, so every metric must be perfect.
    held_out, _ = _split(sample_pairs, per_source=2, max_calls=3)
    keys = defaultdict(list)
    for pair in held_out:
        keys[(api_id(pair), canonical_json(pair["tool_input"]))].append(pair)
    held_out = [p for p in held_out if len(keys[(api_id(p), canonical_json(p["tool_input"]))]) == 1]  # stateful APIs
    cache = ResponseCache(tmp_path / "filled.sqlite")
    rows = []
    for pair in held_out:
        doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        rows.append(
            (
                doc.category,
                doc.tool,
                doc.api,
                canonical_json(pair["tool_input"]),
                pair["response"]["error"],
                pair["response"]["response"],
            )
        )
    assert cache.put_many(rows, "real") == len(held_out)
    cache.close()
    url, _ = virtual_server(
        f"http://127.0.0.1:{free_port()}/v1",
        "unused",
        mode="replay",
        missing_required="simulate",
        cache_path=tmp_path / "filled.sqlite",
    )
    out = tmp_path / "report"
    argv = [
        "--pairs",
        str(_write(tmp_path / "heldout.jsonl", held_out)),
        "--server",
        url + "/virtual",
        "--out",
        str(out),
        "--tools",
        str(samples / "tools"),
        "--no-progress",
    ]
    # By default a call the server answered from what its cache held is counted apart, and scored nowhere.
    assert eval_cli("simulator")(argv) == 0
    report = json.loads((out / "fidelity.json").read_text())
    assert report["cache_hits"] == {
        "n": len(held_out),
        "scored": False,
        "per_source": {
            source: sum(p["source"] == source for p in held_out) for source in {p["source"] for p in held_out}
        },
    }
    assert report["outcomes"] == {"hit": len(held_out)} and report["scored"] == 0
    assert report["overall"]["simulated"] == {"n": 0}
    assert f"**{len(held_out)} answered from the cache**" in (out / "fidelity.md").read_text()
    # Scored anyway (`--include-cache-hits`): the real answers score full marks.
    assert eval_cli("simulator")(argv + ["--include-cache-hits", "--embedding-model", str(tiny_model_dir)]) == 0
    report = json.loads((out / "fidelity.json").read_text())
    assert report["cache_entries_at_start"] == len(held_out) and not report["baseline"]
    assert report["cache_hits"]["scored"] is True and report["scored"] == len(held_out)
    overall = report["overall"]["simulated"]
    assert (overall["bleu4"], overall["rouge_l"], overall["error_agreement"]) == pytest.approx((100.0, 100.0, 100.0))
    assert overall["valid_json_n"] > 0 and overall["valid_json"] == 100.0
    assert overall["schema_n"] > 0 and overall["schema_conformance"] == overall["schema_conformance_real"]
    assert overall["embedding_cosine"] == pytest.approx(100.0, abs=0.01)
    assert overall["error_recall"] in (100.0, None) and overall["error_precision"] in (100.0, None)
    assert (overall["bleu4_length"], overall["bleu4_brevity_penalty"]) == (100.0, 100.0)
    markdown = (out / "fidelity.md").read_text()
    assert "**Warning:** the server's cache held" in markdown
    lengths = next(line for line in markdown.splitlines() if line.startswith("BLEU-4's length"))
    assert all(f"{source} simulator 100.0 / 100.0" in lengths for source in report["per_source"])


def test_the_calls_the_cache_answers_are_left_out_of_every_row(
    eval_cli, virtual_server, sample_pairs, registry, samples, tmp_path
):
    """Held-out calls of which the server's cache holds every other one (as a server seeded with the training
    calls holds those whose arguments a training call repeats): those are counted apart, and the simulator, the
    nearest example and the session pass are scored on the others only. The server replays its cache (no
    engine): a call it does not hold gets its replay-miss error, which is what it 'simulated'."""
    held_out, train = _split(sample_pairs, per_source=2, max_calls=4)
    keys = defaultdict(list)
    for pair in held_out:
        keys[(api_id(pair), canonical_json(pair["tool_input"]))].append(pair)
    held_out = [p for p in held_out if len(keys[(api_id(p), canonical_json(p["tool_input"]))]) == 1]
    cached = held_out[::2]
    cache = ResponseCache(tmp_path / "seeded.sqlite")
    docs = [registry.resolve(p["category"], p["tool_name"], p["api_name"]) for p in cached]
    cache.put_many(
        [
            (
                d.category,
                d.tool,
                d.api,
                canonical_json(p["tool_input"]),
                p["response"]["error"],
                p["response"]["response"],
            )
            for d, p in zip(docs, cached, strict=True)
        ],
        "imported:training",
    )
    cache.close()
    url, _ = virtual_server(
        f"http://127.0.0.1:{free_port()}/v1",
        "unused",
        mode="replay",
        missing_required="simulate",
        cache_path=tmp_path / "seeded.sqlite",
    )
    out = tmp_path / "report"
    argv = [
        "--pairs",
        str(_write(tmp_path / "heldout.jsonl", held_out)),
        "--server",
        url,
        "--out",
        str(out),
        "--baseline-pairs",
        str(_write(tmp_path / "train.jsonl", train)),
        "--history",
        "both",
        "--no-progress",
    ]
    assert eval_cli("simulator")(argv) == 0
    report = json.loads((out / "fidelity.json").read_text())
    others = [p for p in held_out if p not in cached]
    assert report["cache_hits"]["n"] == len(cached) and report["scored"] == len(others)
    assert report["outcomes"] == {"hit": len(cached), "replay_miss": len(others)}
    for side in ("simulated", "baseline"):
        assert report["overall"][side]["n"] == len(others)
    # Every call scored got the replay-miss error: recall is perfect, precision the share of real failures.
    real_errors = sum(is_error(p["response"]) for p in others)
    simulated = report["overall"]["simulated"]
    assert (simulated["error_precision_n"], simulated["error_recall_n"]) == (len(others), real_errors)
    assert simulated["error_precision"] == pytest.approx(100.0 * real_errors / len(others), abs=0.01)
    assert simulated["rouge_l"] < 100.0
    sessions = report["sessions"]
    assert (sessions["cache_hits"], sessions["scored"]) == (len(cached), len(others))
    assert sessions["with"]["overall"]["n"] == sessions["without"]["overall"]["n"] == len(others)
    markdown = (out / "fidelity.md").read_text()
    assert (
        "| replay | step | calls | ROUGE-L | BLEU-4 | error agreement | error precision | error recall |" in markdown
    )
    # The simulator against the example, overall and per source, each with its interval, in the JSON and the text.
    gap = report["overall"]["simulator_against_example"]["rouge_l"]
    difference = simulated["rouge_l"] - report["overall"]["baseline"]["rouge_l"]
    assert gap["difference"] == pytest.approx(difference, abs=0.02)
    assert gap["ci95"][0] <= gap["difference"] <= gap["ci95"][1]
    low, high = simulated["error_precision_ci95"]
    answered = (
        f"simulator {simulated['error_precision_n']} errors answered, precision {simulated['error_precision']:.1f}"
    )
    assert f"{answered} [{low:.1f}, {high:.1f}]" in markdown
    line = next(line for line in markdown.splitlines() if line.startswith("Simulator minus nearest example"))
    assert f"overall ROUGE-L {gap['difference']:+.1f} [{gap['ci95'][0]:+.1f}, {gap['ci95'][1]:+.1f}]" in line
    assert all(f"; {source} ROUGE-L" in line for source in report["per_source"])
    rows = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert [r["from_cache"] for r in rows] == [p in cached for p in held_out]
    assert {r["provenance"] for r in rows if r["from_cache"]} == {"imported:training"}


def test_user_mistakes_are_one_line_and_exit_2(eval_cli, samples, tmp_path, capsys):
    simulator = eval_cli("simulator")
    pairs = str(samples / "pairs.jsonl")
    cases = [
        (["--pairs", pairs, "--server", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)], "does not answer"),
        (
            ["--pairs", str(tmp_path / "none.jsonl"), "--server", "http://127.0.0.1:9", "--out", str(tmp_path)],
            "not found",
        ),
        (
            [
                "--pairs",
                pairs,
                "--server",
                "http://127.0.0.1:9",
                "--out",
                str(tmp_path),
                "--embedding-model",
                str(tmp_path / "no-model"),
            ],
            "embedding model folder not found",
        ),
    ]
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases += [
        # The same calls twice would weigh twice in every row.
        (["--pairs", pairs, pairs, "--server", "http://127.0.0.1:9", "--out", str(tmp_path)], "is already in"),
        # Found before the replay, not after it.
        (["--pairs", pairs, "--server", "http://127.0.0.1:9", "--out", str(a_file)], "is a file, not a folder"),
    ]
    for argv, message in cases:
        assert simulator(argv + ["--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("simulator.py: error:") and message in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize(
    "script, argv",
    [
        ("fac", ["--answers", "a", "--ids", "i", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]),
        ("sowr", ["--reference", "r", "--candidate", "c", "--ids", "i", "--model", "m", "--base-url", "http://x/v1"]),
        ("judge_agreement", ["--labelled", "l.jsonl", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]),
        ("tooleyes", ["--answers", "a", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]),
        ("apibank", ["--server", "http://127.0.0.1:9/virtual", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]),
    ],
)
def test_an_out_that_is_a_file_is_one_line_before_any_call(eval_cli, tmp_path, capsys, script, argv):
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    assert eval_cli(script)([*argv, "--out", str(a_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file, not a folder" in err[0]
    assert a_file.read_text() == "kept"


def stand_in_server(virtual) -> FastAPI:
    """A stand-in for a virtual server (each test says why one): an empty cache on /health, `virtual` on /virtual."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"cache": {"entries": 0}}

    app.post("/virtual")(virtual)
    return app


def test_calls_alone_do_not_wait_for_their_episode_and_a_session_s_calls_do(sample_pairs):
    # A STAND-IN for the virtual server, named as such: what is tested is when the calls arrive, which the real
    # server, answering a replayed call at once, cannot show. It takes 0.5 s over every call and notes when each
    # one came and went.
    episode = next(
        calls[:3]
        for calls in _episodes(sample_pairs).values()
        if len({json.dumps(c["tool_input"], ensure_ascii=False) for c in calls[:3]}) == 3
    )
    seen: list[tuple[str, float, float]] = []

    async def virtual(request: Request):
        body, came = await request.json(), time.monotonic()
        await asyncio.sleep(0.5)
        seen.append((body["tool_input"], came, time.monotonic()))
        return {"error": "", "response": "ok"}

    app = stand_in_server(virtual)

    def arrivals(sessions):
        seen.clear()
        answers, _ = asyncio.run(replay(episode, server, concurrency=4, progress=False, sessions=sessions))
        assert [a["response"] for a in answers] == ["ok"] * len(episode)
        by_call = {call: (came, went) for call, came, went in seen}
        return [by_call[json.dumps(p["tool_input"], ensure_ascii=False)] for p in episode]  # in step order

    with serve_in_thread(app, free_port(), timeout=20) as server:
        alone = arrivals(None)
        in_session = arrivals("test:")
    # Alone: every call of the episode was sent before the first was answered. In a session: each call only
    # once the one before it was answered.
    assert all(came < alone[0][1] for came, _ in alone)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(in_session))


def test_a_server_that_answers_a_null_error_is_read_as_no_error(sample_pairs):
    # A STAND-IN for a StableToolBench server, named as such: its server/main.py passes the model's JSON through
    # once it parses, so `"error": null` can come back; the project reads null as no error everywhere
    # (`records.observation_json`), and the replay scored "null" a failure on every call.
    async def virtual(request: Request):
        return {"error": None, "response": "ok"}

    app = stand_in_server(virtual)
    calls = sample_pairs[:3]
    with serve_in_thread(app, free_port(), timeout=20) as server:
        answers, _ = asyncio.run(replay(calls, server, concurrency=2, progress=False))
    assert [(a["error"], a["response"]) for a in answers] == [("", "ok")] * len(calls)
