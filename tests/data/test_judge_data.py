"""The judge SFT builder: fac-v1 prompts, parseable verdict targets, balanced training split,
queries never split between train and test, and the CLI on good and bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

from mirrorapi.data.judge_sft import build_judge_records
from mirrorapi.prompts.judge_formats import judge_messages, parse_verdict
from mirrorapi.records import read_labelled

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples"
LABELLED = [json.loads(line) for line in open(SAMPLES / "judge.jsonl", encoding="utf-8")]


def test_records_use_the_evaluation_prompt_and_parse_back(judge_sft_dir):
    dataset = load_from_disk(str(judge_sft_dir))
    by_id = {r["id"]: r for r in LABELLED}
    for split in dataset.values():
        for record in split:
            original = by_id[record["id"]]
            assert record["prompt"] == judge_messages(original["query"], original["final_answer"], "fac-v1")
            verdict, _ = parse_verdict(record["completion"][0]["content"])
            assert verdict == original["label"] == record["label"]


def test_train_is_balanced_and_queries_stay_on_one_side(judge_sft_dir):
    dataset = load_from_disk(str(judge_sft_dir))
    labels = dataset["train"]["label"]
    assert labels.count("Solved") == labels.count("Unsolved") > 0
    queries = {
        split: {json.dumps(r["prompt"][1]["content"].split("\n\nFinal answer:")[0]) for r in dataset[split]}
        for split in ("train", "test")
    }
    assert len(dataset["test"]) and not queries["train"] & queries["test"]
    stats = json.loads((judge_sft_dir / "stats.json").read_text())
    assert stats["dropped"]["empty_answer"] == sum(1 for r in LABELLED if not r["final_answer"].strip())
    assert stats["splits"]["train"]["records"] == len(dataset["train"])


def test_duplicates_and_conflicts_are_counted():
    """A copy is dropped; an answer under both labels is dropped whole: which label trained depended on the files'
    order (either order now builds the same sets)."""
    first = LABELLED[0]
    flipped = {**first, "id": "x", "label": "Unsolved" if first["label"] == "Solved" else "Solved"}
    splits, stats = build_judge_records(LABELLED + [dict(first, id="copy"), flipped], test_fraction=0.2)
    assert (stats["dropped"]["duplicate"], stats["dropped"]["duplicate_conflicting"]) == (1, 2)
    assert not {first["id"], "copy", "x"} & {r["id"] for rs in splits.values() for r in rs}
    reordered, _ = build_judge_records([flipped, *LABELLED, dict(first, id="copy")], test_fraction=0.2)
    assert {name: sorted(r["id"] for r in rs) for name, rs in reordered.items()} == {
        name: sorted(r["id"] for r in rs) for name, rs in splits.items()
    }


def test_a_file_with_nothing_to_train_on_is_refused_and_the_set_it_would_replace_stays(judge_sft_dir, tmp_path):
    """Every label misspelt (`solved`): one line naming the file and line, exit 2, and an earlier build in --out
    kept (an empty set, which `load_from_disk` cannot read, took its place with exit 0)."""
    import shutil

    out = tmp_path / "judge"
    shutil.copytree(judge_sft_dir, out)
    lower = tmp_path / "lower.jsonl"
    lower.write_text("".join(json.dumps({**r, "label": r["label"].lower()}) + "\n" for r in LABELLED[:3]))
    done = subprocess.run(
        [sys.executable, str(REPO / "data/build_judge_sft.py"), "--labelled", str(lower), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "build_judge_sft.py: error: no labelled answer kept of 0 read (none): nothing to train on; 3 unreadable "
        f"line(s), e.g. lower.jsonl:1: label {LABELLED[0]['label'].lower()!r} is not Solved or Unsolved"
    )
    assert len(load_from_disk(str(out))["train"]) == len(load_from_disk(str(judge_sft_dir))["train"])


def test_repeat_sources_repeats_a_sources_training_answers_after_balancing():
    source = LABELLED[0]["source"]
    plain, _ = build_judge_records(LABELLED, test_fraction=0.2)
    repeated, stats = build_judge_records(LABELLED, test_fraction=0.2, repeat_sources=[f"{source}=3"])
    ones = [r for r in plain["train"] if r["source"] == source]
    assert ones and repeated["train"] == [r for r in plain["train"] for _ in range(3 if r["source"] == source else 1)]
    assert repeated["test"] == plain["test"]
    assert stats["splits"]["train"]["by_source"][source] == 3 * len(ones)
    assert stats["options"]["repeat_sources"] == [f"{source}=3"]
    with pytest.raises(ValueError, match="SOURCE=N"):
        build_judge_records(LABELLED, repeat_sources=[source])


def test_cli(tmp_path):
    bad = tmp_path / "labelled.jsonl"
    bad.write_text(open(SAMPLES / "judge.jsonl").read() + '{"query": "no label"}\n', encoding="utf-8")
    ok = subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_judge_sft.py"),
            "--labelled",
            str(bad),
            "--out",
            str(tmp_path / "judge"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["dropped"]["unreadable"] == 1
    # said on stderr too, not only counted in the summary
    assert [line for line in ok.stderr.splitlines() if line.startswith("WARNING")] == [
        "WARNING mirrorapi.data.commands: 1 unreadable line(s) skipped, e.g. labelled.jsonl:77: missing or non-string "
        "source, id, final_answer, label"
    ]
    assert set(load_from_disk(str(tmp_path / "judge"))) == {"train", "test"}
    missing = subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_judge_sft.py"),
            "--labelled",
            "nope.jsonl",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == "build_judge_sft.py: error: labelled answers file not found: nope.jsonl"
    )


def test_reader_reports_bad_lines(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps(LABELLED[0]) + "\n{broken\n" + json.dumps({**LABELLED[0], "label": 1}) + "\n")
    bad = []
    assert len(list(read_labelled(path, bad.append))) == 1
    assert len(bad) == 2 and "label" in bad[1]


def test_a_non_string_reason_or_label_kind_is_a_bad_line(tmp_path, capsys):
    """A list as `reason` stopped the build with an AttributeError traceback (`reason.strip()` in its target)."""
    from mirrorapi.cli import main

    path = tmp_path / "labelled.jsonl"
    odd = [{**LABELLED[0], "reason": ["a", "list"]}, {**LABELLED[1], "label_kind": {"a": 1}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in [*odd, {**LABELLED[2], "reason": None}, *LABELLED[3:]]))
    bad: list[str] = []
    assert len(list(read_labelled(path, bad.append))) == len(LABELLED) - 2  # null: no reason, as before
    assert bad == ["labelled.jsonl:1: non-string reason", "labelled.jsonl:2: non-string label_kind"]
    assert main(["data", "build-judge-sft", "--labelled", str(path), "--out", str(tmp_path / "judge")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["dropped"]["unreadable"] == 2


def test_a_repeated_source_no_record_has_is_refused():
    """A misspelt source (`--repeat-sources tau-bench/airlines=4`) repeated nothing, silently."""
    with pytest.raises(ValueError, match="no record has the source 'nosuch'"):
        build_judge_records(LABELLED, repeat_sources=["nosuch=3"])


def _answers(source: str, solved: int, unsolved: int) -> list[dict]:
    labels = ["Solved"] * solved + ["Unsolved"] * unsolved
    return [
        {
            "source": source,
            "id": f"{source}-{i}",
            "query": f"{source} task {i}: book the flight",
            "final_answer": f"Answer {i} of {source}: the flight is booked as asked.",
            "label": label,
            "label_kind": "test",
        }
        for i, label in enumerate(labels)
    ]


def test_per_source_balance_repeats_each_sources_rarer_verdict_and_drops_nothing():
    """`drop` balances the whole training side before a source's repeats, so a repeated source keeps its skew;
    `per-source` repeats, after the repeats, each source's rarer verdict until both weigh the same there."""
    labelled = _answers("skewed", 3, 7) + _answers("even", 5, 5) + _answers("one-sided", 2, 0)
    dropped, _ = build_judge_records(labelled, test_fraction=0.0, repeat_sources=["skewed=2"])
    kept = {r["id"] for r in dropped["train"]}
    assert len(kept) == 22 - 2  # 10 Solved and 12 Unsolved answers: 2 Unsolved ones dropped
    splits, stats = build_judge_records(
        labelled, test_fraction=0.0, repeat_sources=["skewed=2"], balance="per-source", seed=7
    )
    counts = {
        (source, label): sum(r["source"] == source and r["label"] == label for r in splits["train"])
        for source in ("skewed", "even", "one-sided")
        for label in ("Solved", "Unsolved")
    }
    assert counts == {
        ("skewed", "Solved"): 14,  # 3 answers twice, then repeated to the 7 Unsolved answers' 14 records
        ("skewed", "Unsolved"): 14,
        ("even", "Solved"): 5,
        ("even", "Unsolved"): 5,
        ("one-sided", "Solved"): 2,  # nothing to repeat on the other side
        ("one-sided", "Unsolved"): 0,
    }
    assert {r["id"] for r in splits["train"]} == {r["id"] for r in labelled}  # every answer trains
    copies = [sum(r["id"] == f"skewed-{i}" for r in splits["train"]) for i in range(3)]
    assert sorted(copies) == [4, 5, 5]  # 14 records of 3 answers: each 4 times, two drawn once more
    assert (stats["repeated_to_balance"], stats["dropped"]["balancing"]) == (8, 0)
    assert stats["options"]["balance"] == "per-source"
    again, _ = build_judge_records(
        labelled, test_fraction=0.0, repeat_sources=["skewed=2"], balance="per-source", seed=7
    )
    assert again == splits  # seeded
    with pytest.raises(ValueError, match="unknown balance rule 'both'"):
        build_judge_records(labelled, balance="both")
