"""How `make demo` uses the shipped models (scripts/demo_steps/run.py), without training or serving anything: the
held-out calls it scores them on and the settings it serves them with, from a shipped model's record."""

from __future__ import annotations

import json
from pathlib import Path

from demo_steps.build import DemoData, choose_data
from demo_steps.run import Demo, DemoOptions

from mirrorapi.models.catalogue import TRAINING_FILE
from mirrorapi.records import read_pairs_jsonl

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"


def write_pairs(path: Path, pairs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


EPISODES = list(dict.fromkeys((p["source"], str(p["episode"])) for p in read_pairs_jsonl(SAMPLES / "pairs.jsonl")))


def a_demo(tmp_path: Path, record: dict | None) -> Demo:
    """A real-weights demo after step 1 on the bundled sample: its first episodes are the training split, the
    next ones its held-out split; with `record`, a shipped simulator whose record it is."""
    pairs = list(read_pairs_jsonl(SAMPLES / "pairs.jsonl"))
    train_episodes, test_episodes = set(EPISODES[:20]), set(EPISODES[20:40])
    demo = Demo(DemoOptions(tmp_path / "work", None, real=True))
    folder = tmp_path / "data"
    folder.mkdir()
    demo.data = DemoData(
        folder,
        False,
        choose_data(None),
        SAMPLES / "pairs.jsonl",
        write_pairs(folder / "train.jsonl", [p for p in pairs if (p["source"], str(p["episode"])) in train_episodes]),
        write_pairs(folder / "test.jsonl", [p for p in pairs if (p["source"], str(p["episode"])) in test_episodes]),
        folder / "judge_test.jsonl",
        folder / "simulator",
        folder / "judge",
        folder / "stb",
        {},
    )
    if record is not None:
        shipped = tmp_path / "shipped"
        shipped.mkdir()
        (shipped / TRAINING_FILE).write_text(json.dumps(record))
        demo.shipped["simulator"] = shipped
    return demo


def test_without_a_shipped_simulator_the_run_s_own_held_out_calls_are_scored(tmp_path):
    demo = a_demo(tmp_path, None)
    candidates, where = demo.heldout_candidates()
    assert candidates == list(read_pairs_jsonl(demo.data.test_pairs)) and "this run's held-out split" in where
    assert demo.main_settings == demo.trained_settings and demo.trained_settings["prompt_format"] == "mirrorapi-v2"


def test_a_shipped_simulator_is_scored_on_episodes_it_never_trained_on_nor_did_the_run_s_models(tmp_path):
    # The shipped model held out two of the run's training episodes, two of its held-out ones and one the run's
    # split never had: only the last three are unseen by every model, and they are taken whole.
    named = [EPISODES[3], EPISODES[7], EPISODES[25], EPISODES[33], EPISODES[-1]]
    demo = a_demo(
        tmp_path, {"kind": "simulator", "prompt_format": "mirrorapi-v2", "heldout_episodes": [list(e) for e in named]}
    )
    candidates, where = demo.heldout_candidates()
    assert "the shipped simulator's record names as held out" in where
    unseen = set(named[2:])
    assert candidates == [
        p for p in read_pairs_jsonl(SAMPLES / "pairs.jsonl") if (p["source"], str(p["episode"])) in unseen
    ]
    assert {(p["source"], str(p["episode"])) for p in candidates} == unseen


def test_a_shipped_simulator_without_held_out_episodes_is_said(tmp_path):
    demo = a_demo(tmp_path, {"kind": "simulator", "prompt_format": "mirrorapi-v2"})
    candidates, where = demo.heldout_candidates()
    assert candidates == list(read_pairs_jsonl(demo.data.test_pairs))
    assert "WARNING" in where and "may be among its training calls" in where


def test_a_shipped_simulator_is_served_with_its_record_s_settings(tmp_path):
    record = {
        "kind": "simulator",
        "prompt_format": "mirrorapi-session-v2",
        "server_settings": {
            "prompt_format": "mirrorapi-v2",
            "few_shot": 1,
            "session_history": 8,
            "session_char_budget": 4096,
            "max_tokens": 384,
            "port": 1,
            "cache_path": "/elsewhere.sqlite",
        },
    }
    demo = a_demo(tmp_path, record)
    settings = demo.main_settings
    assert settings == {
        "prompt_format": "mirrorapi-v2",
        "few_shot": 1,
        "session_history": 8,
        "session_char_budget": 4096,
        "max_tokens": 384,
    }  # where to listen and cache: the demo's
    # The run's own fine-tune keeps the settings it was trained with: its examples' ties go to the median size;
    # a shipped model's record that names no rule is served with the server's default (the shortest).
    assert demo.trained_settings["few_shot"] == 1 and demo.trained_settings["session_history"] == 4
    assert demo.trained_settings["few_shot_ties"] == "median" and "few_shot_ties" not in settings


def test_without_server_settings_a_shipped_simulator_is_served_as_its_training_data_was_built(tmp_path):
    # The record training/sft.py writes: the SFT set's stats, whose options say how its prompts were made (those of
    # scripts/train_shipped_models.py's simulator data).
    options = {
        "prompt_format": "mirrorapi-v2",
        "few_shot": 1,
        "few_shot_char_budget": 1024,
        "few_shot_response_chars": 600,
        "target_response_chars": 1024,
        "history": 8,
        "history_char_budget": 4096,
        "stateless_too": True,
    }
    demo = a_demo(
        tmp_path,
        {
            "kind": "simulator",
            "prompt_format": "mirrorapi-session-v2",
            "dataset_stats": {"kind": "simulator", "options": options},
        },
    )
    assert demo.main_settings == {
        "max_tokens": 512,
        "prompt_format": "mirrorapi-v2",
        "few_shot": 1,
        "few_shot_char_budget": 1024,
        "few_shot_response_chars": 600,
        "session_history": 8,
        "session_char_budget": 4096,
    }
