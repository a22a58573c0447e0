"""`python eval/judge_agreement.py`: agreement statistics, and a run of the tiny judge on real labelled answers."""

import json

import pytest

from harness.fake_engines import FixedReplyEngine
from mirrorapi.evaluation.judge.agreement import agreement_stats, cohen_kappa

LABELLED_KEYS = ("source", "id", "query", "final_answer", "label", "label_kind")


def test_cohen_kappa_of_a_textbook_table():
    # 50 items: both Yes 20, first Yes / second No 5, first No / second Yes 10, both No 15.
    # p_o = 35/50 = 0.7; p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = (0.7 - 0.5) / 0.5 = 0.4.
    pairs = [("Y", "Y")] * 20 + [("Y", "N")] * 5 + [("N", "Y")] * 10 + [("N", "N")] * 15
    assert cohen_kappa(pairs) == pytest.approx(0.4)
    assert cohen_kappa([("Y", "Y")] * 3) is None  # chance agreement 1: undefined, not 0 or 1
    assert cohen_kappa([("Y", "N"), ("N", "Y")]) == pytest.approx(-1.0)


def test_unparseable_predictions_count_as_unsolved_and_have_their_own_column():
    rows = [
        {"label": "Solved", "prediction": "Solved"},
        {"label": "Solved", "prediction": "unparseable"},
        {"label": "Unsolved", "prediction": "unparseable"},
        {"label": "Unsolved", "prediction": "Solved"},
    ]
    stats = agreement_stats(rows)
    assert stats["accuracy"] == 0.5  # rows 1 and 3 agree once unparseable is read as Unsolved
    assert stats["confusion"] == {
        "Solved": {"Solved": 1, "Unsolved": 0, "unparseable": 1},
        "Unsolved": {"Solved": 1, "Unsolved": 0, "unparseable": 1},
    }
    assert (stats["n"], stats["unparseable"], stats["labelled_solved"], stats["predicted_solved"]) == (4, 2, 2, 2)


def test_a_judge_saying_solved_to_all_stands_beside_every_slice():
    # 3 Solved and 1 Unsolved labels: saying Solved to all agrees 3 times in 4, and no better than chance.
    rows = [{"label": label, "prediction": "Unsolved"} for label in ("Solved", "Solved", "Solved", "Unsolved")]
    assert agreement_stats(rows)["solved_to_all"] == {"accuracy": 0.75, "kappa": 0.0}
    assert agreement_stats(rows)["over_solved_to_all"]["difference"] == 0.25 - 0.75  # this judge says Unsolved
    # Every label Solved: chance agreement is 1, so its kappa is undefined (n/a), not 0.
    assert agreement_stats(rows[:3])["solved_to_all"] == {"accuracy": 1.0, "kappa": None}


def test_accuracy_and_kappa_come_with_bootstrap_intervals():
    # The textbook table above: accuracy 0.7, kappa 0.4. Resampling its 50 answers moves both by a good deal.
    table = [("Solved", "Solved")] * 20 + [("Solved", "Unsolved")] * 5
    table += [("Unsolved", "Solved")] * 10 + [("Unsolved", "Unsolved")] * 15
    stats = agreement_stats([{"label": label, "prediction": prediction} for label, prediction in table])
    assert (stats["accuracy"], stats["kappa"]) == (0.7, 0.4)
    # Against a judge saying Solved to all (25 of 50 right): 0.2 more, the 15 Unsolved answers it calls so less the 5
    # Solved ones it calls Unsolved, and more than the draw of answers would give.
    lead = stats["over_solved_to_all"]
    assert lead["difference"] == pytest.approx(stats["accuracy"] - stats["solved_to_all"]["accuracy"]) == 0.2
    assert 0 < lead["ci95"][0] < 0.2 < lead["ci95"][1]
    for figure in ("accuracy", "kappa"):
        low, high = stats[f"{figure}_ci95"]
        assert low < stats[figure] < high and high - low > 0.15
    # A judge right on every answer is right on every resample; where every label and verdict is one value, kappa
    # is undefined on every resample too (no interval, not a made-up one).
    perfect = agreement_stats([{"label": label, "prediction": label} for label, _ in table])
    assert (perfect["accuracy_ci95"], perfect["kappa_ci95"]) == ([1.0, 1.0], [1.0, 1.0])
    one_value = agreement_stats([{"label": "Solved", "prediction": "Solved"}] * 5)
    assert (one_value["accuracy_ci95"], one_value["kappa_ci95"]) == ([1.0, 1.0], None)


@pytest.mark.slow
def test_agreement_report_on_the_labelled_sample(eval_cli, tiny_engine, samples, tmp_path):
    labelled = samples / "judge.jsonl"
    records, per_source = [], {}
    for record in map(json.loads, labelled.read_text().splitlines()):  # the first 6 of each source (--limit 6)
        per_source[record["source"]] = per_source.get(record["source"], 0) + 1
        if per_source[record["source"]] <= 6:
            records.append(record)
    argv = [
        "--labelled",
        str(labelled),
        "--base-url",
        tiny_engine.base_url,
        "--model",
        tiny_engine.model,
        "--out",
        str(tmp_path),
        "--max-tokens",
        "8",
        "--concurrency",
        "4",
        "--limit",
        "6",
        "--no-progress",
    ]
    assert eval_cli("judge_agreement")(argv) == 0
    report = json.loads((tmp_path / "agreement.json").read_text())
    assert report["overall"]["n"] == len(records) and report["pending"] == 0
    sources = {r["source"] for r in records}
    assert set(report["per_source"]) == sources
    for source, stats in report["per_source"].items():
        assert stats["n"] == sum(r["source"] == source for r in records)
        assert stats["labelled_solved"] == sum(r["source"] == source and r["label"] == "Solved" for r in records)
        assert stats["solved_to_all"]["accuracy"] == round(stats["labelled_solved"] / stats["n"], 4)
        assert sum(sum(row.values()) for row in stats["confusion"].values()) == stats["n"]
    assert sum(s["n"] for s in report["per_label_kind"].values()) == len(records)
    predictions = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == len(records)
    # The StableToolBench CoT answer to query 588 is empty: Unsolved without a judge call, as in FAC.
    empty = [p for p in predictions if not p["judged"]]
    assert [p["id"] for p in empty] == [r["id"] for r in records if not r["final_answer"].strip()]
    assert all(p["prediction"] == "Unsolved" for p in empty)
    markdown = (tmp_path / "agreement.md").read_text()
    assert "| Slice | n | accuracy | Cohen's kappa | Solved-to-all accuracy | Solved-to-all kappa |" in markdown
    overall = report["overall"]
    low, high = overall["accuracy_ci95"]
    assert f"| overall | {overall['n']} | {overall['accuracy']:.3f} [{low:.3f}, {high:.3f}] |" in markdown
    assert "(rows: label, columns: judge)" in markdown
    # Resumed: a second run sends nothing and reports the same.
    assert eval_cli("judge_agreement")(argv) == 0
    assert json.loads((tmp_path / "agreement.json").read_text()) == report


@pytest.mark.slow
@pytest.mark.shared
def test_limit_per_source_on_the_shared_labelled_set(eval_cli, tiny_engine, shared_data, tmp_path):
    labelled = shared_data / "judge" / "labelled.jsonl"
    argv = [
        "--labelled",
        str(labelled),
        "--base-url",
        tiny_engine.base_url,
        "--model",
        tiny_engine.model,
        "--out",
        str(tmp_path),
        "--max-tokens",
        "8",
        "--limit",
        "3",
        "--no-progress",
    ]
    assert eval_cli("judge_agreement")(argv) == 0
    report = json.loads((tmp_path / "agreement.json").read_text())
    sources = {json.loads(line)["source"] for line in labelled.read_text().splitlines()}
    assert {s: v["n"] for s, v in report["per_source"].items()} == {s: 3 for s in sources}


def test_a_rerun_scores_the_labels_given_now_and_judges_changed_answers_again(eval_cli, tmp_path):
    # The judge is a stand-in that says Solved to everything (a real judge's verdicts cannot be chosen beforehand):
    # what is measured here is which answers a resumed run sends to it, and which labels it scores against.
    records = [
        {"source": "s", "id": str(i), "query": f"query {i}", "final_answer": f"answer {i}", "label": "Solved"}
        | {"label_kind": "k"}
        for i in range(4)
    ]
    labelled = tmp_path / "labelled.jsonl"
    out = tmp_path / "out"

    def judged(engine) -> list[str]:  # the answers sent for a verdict (the run's reachability check is not one)
        return [r["messages"][-1]["content"] for r in engine.requests if "Final answer:" in str(r["messages"])]

    def run(engine) -> dict:
        labelled.write_text("".join(json.dumps(r) + "\n" for r in records))
        argv = ["--labelled", str(labelled), "--base-url", engine.url, "--model", "judge", "--no-progress"]
        assert eval_cli("judge_agreement")([*argv, "--out", str(out)]) == 0
        return json.loads((out / "agreement.json").read_text())["overall"]

    with FixedReplyEngine("Verdict: Solved\nReason: fine") as judge:
        assert run(judge)["accuracy"] == 1.0 and len(judged(judge)) == 4
        for record in records[:3]:  # labels corrected in the labelled file: nothing to judge again
            record["label"] = "Unsolved"
        again = run(judge)
        assert len(judged(judge)) == 4
        assert (again["accuracy"], again["labelled_solved"]) == (0.25, 1)
        records[3]["final_answer"] = "another answer"  # a changed answer is judged again, and only it
        run(judge)
        assert len(judged(judge)) == 5 and "another answer" in judged(judge)[-1]


def test_an_answer_labelled_twice_is_an_error(eval_cli, tmp_path, capsys):
    record = {"source": "s", "id": "7", "query": "q", "final_answer": "a", "label": "Solved", "label_kind": "k"}
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(json.dumps(record) + "\n")
    second.write_text(json.dumps(record | {"label": "Unsolved"}) + "\n")
    argv = ["--labelled", str(first), str(second), "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    assert eval_cli("judge_agreement")([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'7' again" in err[0] and str(first) in err[0]


def test_bad_labelled_files_are_one_line_errors(eval_cli, tmp_path, capsys):
    good = {k: "x" for k in LABELLED_KEYS} | {"label": "Solved"}
    cases = {
        "not-json.jsonl": "{oops\n",
        "no-label.jsonl": json.dumps({"source": "s", "id": "1"}) + "\n",
        "bad-label.jsonl": json.dumps(good | {"label": "Maybe"}) + "\n",
    }
    for name, content in cases.items():
        (tmp_path / name).write_text(content)
        argv = [
            "--labelled",
            str(tmp_path / name),
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--out",
            str(tmp_path / "out"),
        ]
        assert eval_cli("judge_agreement")(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("judge_agreement.py: error:") and f"{name}:1" in err[0]


def test_intervals_resample_a_querys_answers_together():
    """Two tau-bench tasks of four trials each, one judged right on every trial and one wrong on every trial: the
    trials are no independent draws, so a resample draws both tasks, one twice or the other (accuracy 1, 1/2 or 0:
    the 95% interval [0, 1]); resampled answer by answer the interval would claim [1/8, 7/8]."""
    rows = [
        {"label": "Solved", "prediction": prediction, "group": task}
        for task, prediction in (("task 1", "Solved"), ("task 2", "Unsolved"))
        for _ in range(4)
    ]
    assert agreement_stats(rows)["accuracy_ci95"] == [0.0, 1.0]
    by_answer = agreement_stats([{k: v for k, v in r.items() if k != "group"} for r in rows])["accuracy_ci95"]
    assert 0.0 < by_answer[0] and by_answer[1] < 1.0
    # One task alone: every resample is the task itself, so there is no interval to give.
    assert agreement_stats(rows[:4])["accuracy_ci95"] is None
