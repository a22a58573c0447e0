"""scripts/train_shipped_models.py, the one run of a lent GPU machine (issue 35), on the CPU on a tiny slice: the
data builders' splits, both trainings under `accelerate launch` (one stopped by its time limit), the offline
scores, and an output folder a lent machine hands back whole (at most 8 files, 16 MiB each, no folders)."""

import contextlib
import io
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from datasets import load_from_disk
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shipped_run(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("shipped")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/train_shipped_models.py"),
            "--tiny",
            "--base",
            str(tiny_model_dir),
            "--work",
            str(work),
            "--simulator-set",
            "max_train_seconds=0.001",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return work


def test_the_output_is_what_a_lent_machine_hands_back(shipped_run):
    files = sorted((shipped_run / "out").iterdir())
    assert 0 < len(files) <= 8 and all(f.is_file() and f.stat().st_size <= 16 * 2**20 for f in files)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files)
    assert {f.name for f in files} >= {
        "report.json",
        "simulator-adapter.tar",
        "judge-adapter.tar",
        "judge_scores.jsonl",
        "generations.jsonl.xz",
        "decisions.json",
        "logs.tar.xz",
    }


def test_each_adapter_ships_in_float16_with_its_record(shipped_run, tmp_path):
    for kind in ("simulator", "judge"):
        with tarfile.open(shipped_run / "out" / f"{kind}-adapter.tar") as tar:
            tar.extractall(tmp_path, filter="data")
        folder = tmp_path / f"{kind}-adapter"
        assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA"
        with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as weights:
            dtypes = {str(weights.get_tensor(name).dtype) for name in weights.keys()}  # noqa: SIM118
        assert dtypes == {"torch.float16"}
        record = json.loads((folder / "mirrorapi_training.json").read_text())
        assert record["kind"] == kind and record["adapter"] is True


def test_the_report_has_throughput_eval_losses_and_the_time_limit(shipped_run):
    report = json.loads((shipped_run / "out" / "report.json").read_text())
    simulator, judge = report["simulator"], report["judge"]
    # max_train_seconds stopped the simulator after its first step; the judge ran its 3
    assert (simulator["metrics"]["steps"], simulator["metrics"]["planned_steps"]) == (1, 3)
    assert simulator["metrics"]["stopped_early"] is True and judge["metrics"]["stopped_early"] is False
    assert judge["metrics"]["steps"] == 3
    for name in ("eval_test_id_loss", "eval_test_ood_loss"):
        assert simulator["metrics"][name] > 0
    assert judge["metrics"]["eval_test_loss"] > 0
    assert simulator["tokens_per_second"] > 0 and judge["tokens_per_second"] > 0
    assert report["machine"]["device"] == "cpu" and simulator["mfu"] is None  # no GPU peak to divide by
    assert report["base_parameters"] > 0 and "scoring_failed" not in report


def test_the_judge_is_scored_on_every_held_out_answer(shipped_run):
    rows = [json.loads(line) for line in (shipped_run / "out" / "judge_scores.jsonl").read_text().splitlines()]
    test = load_from_disk(str(shipped_run / "data" / "judge"))["test"]
    assert [r["id"] for r in rows] == test["id"] and [r["label"] for r in rows] == test["label"]
    for r in rows:
        assert {r["trained"], r["base"]} <= {"Solved", "Unsolved"}
        assert r["trained"] == max(("Solved", "Unsolved"), key=lambda v: r[f"trained:{v}"])
    agreement = json.loads((shipped_run / "out" / "report.json").read_text())["judge"]["offline_agreement"]["trained"]
    assert agreement["all"]["judge"]["n"] == len(rows)


def test_generations_cover_every_held_out_stratum_and_are_scored(shipped_run):
    with lzma.open(shipped_run / "out" / "generations.jsonl.xz", "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    dataset = load_from_disk(str(shipped_run / "data" / "simulator"))
    strata = {(split, r["source"], r["prompt_format"]) for split in ("test_id", "test_ood") for r in dataset[split]}
    assert {(r["split"], r["source"], r["prompt_format"]) for r in rows} == strata
    scores = json.loads((shipped_run / "out" / "fidelity-offline.json").read_text())
    assert set(scores) == {"mirrorapi-v2", "mirrorapi-session-v2"}
    scored = sum(part.get("calls", 0) for report in scores.values() for part in report.values())
    assert scored == len(rows)


def test_the_failure_decisions_are_read_on_the_answered_records(shipped_run):
    from mirrorapi.evaluation.fidelity.metrics import is_error

    found = json.loads((shipped_run / "out" / "decisions.json").read_text())
    answered = generations(shipped_run / "out")
    assert [(r["split"], r["episode"], r["step"], r["prompt_format"]) for r in found["records"]] == [
        (r["split"], r["episode"], r["step"], r["prompt_format"]) for r in answered
    ]
    for decided, row in zip(found["records"], answered, strict=True):
        assert decided["failed"] == is_error(json.loads(row["target"]))  # the real answer the record was built from
        assert 0.0 <= decided["p_failure"] <= 1.0
    report = json.loads((shipped_run / "out" / "report.json").read_text())
    assert report["simulator"]["failure_decisions"] == {
        group: parts["overall"] for group, parts in found["tables"].items()
    }


def run_script(*argv: str, exit_code: int = 0) -> subprocess.CompletedProcess:
    """The script run as a user runs it, which must end with `exit_code` (2: a usage error)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/train_shipped_models.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == exit_code, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def run_stage(entry_script):
    """A stage on the tiny slice, its output: run in this process (`shipped_run` runs the script as a process; each
    stage's own process spent ~10 s of its 11-19 s importing torch, transformers and PEFT again)."""
    script = entry_script("scripts/train_shipped_models.py")

    def run(*argv: str) -> str:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            assert script.main(["--tiny", *argv]) == 0
        return output.getvalue()

    return run


def generations(out: Path) -> list[dict]:
    with lzma.open(out / "generations.jsonl.xz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_the_answer_stage_answers_the_same_records_as_the_train_stage_without_training(
    shipped_run, tiny_model_dir, tmp_path, run_stage
):
    # an adapter answered again, alone: the first records of the same sample, greedy, so the same answers
    adapter = shipped_run / "simulator"
    weights = (adapter / "adapter_model.safetensors").read_bytes()
    run_stage(
        "--stage", "answer", "--work", str(shipped_run), "--base", str(tiny_model_dir), "--adapter", str(adapter),
        "--answers", "3", "--out", str(tmp_path),
    )  # fmt: skip
    trained, answered = generations(shipped_run / "out")[:3], generations(tmp_path)
    assert [(r["split"], r["episode"], r["step"], r["prompt_format"]) for r in answered] == [
        (r["split"], r["episode"], r["step"], r["prompt_format"]) for r in trained
    ]
    assert [r["generated"] for r in answered] == [r["generated"] for r in trained]
    assert all(isinstance(r["cut"], bool) for r in answered)
    assert (adapter / "adapter_model.safetensors").read_bytes() == weights  # nothing trained


def test_the_answer_stage_asks_a_served_simulator_as_the_server_asks_it(shipped_run, tiny_engine, tmp_path, run_stage):
    # a real engine on loopback (`transformers serve` of the tiny model), asked the sample's first records: the same
    # records as the train stage answered, each answer the engine's text, the limit it hit marked
    run_stage(
        "--stage", "answer", "--work", str(shipped_run), "--engine", tiny_engine.base_url,
        "--engine-model", tiny_engine.model, "--answers", "3", "--out", str(tmp_path),
    )  # fmt: skip
    trained, answered = generations(shipped_run / "out")[:3], generations(tmp_path)
    assert [(r["episode"], r["step"], r["prompt_format"], r["target"]) for r in answered] == [
        (r["episode"], r["step"], r["prompt_format"], r["target"]) for r in trained
    ]
    # the untrained tiny model writes 16 tokens (--tiny's limit) that decode to no text: each answer is marked cut
    # from the engine's own count (`usage`), not from the text
    assert all(isinstance(r["generated"], str) and r["cut"] for r in answered)


def test_the_answer_stage_refuses_data_built_otherwise_than_its_model_is_served(shipped_run, tmp_path, run_stage):
    # A model whose record says its server shows examples by the median rule, asked with prompts of data built by
    # the shortest (the data stage's default): its answers would not be the server's. Refused before any call.
    options = json.loads((shipped_run / "data" / "simulator" / "stats.json").read_text())["options"]
    served = tmp_path / "served-model"
    served.mkdir()
    record = {"kind": "simulator", "server_settings": {"few_shot_ties": "median", "few_shot": options["few_shot"]}}
    (served / "mirrorapi_training.json").write_text(json.dumps(record))
    assert options["few_shot_ties"] == "shortest"
    with pytest.raises(SystemExit, match=r"few_shot_ties 'median' \(the data: 'shortest'\)"):
        run_stage(
            "--stage", "answer", "--work", str(shipped_run), "--engine", "http://127.0.0.1:9/v1",
            "--engine-model", str(served), "--answers", "1", "--out", str(tmp_path / "out"),
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_history_twins_ask_each_session_call_again_without_its_history(shipped_run, tiny_engine, tmp_path, run_stage):
    # --history-twins: after the sample's records (answered as without it), each of its session calls once more as
    # its split's stateless record of the same call, scored against the session record's real answer. The whole
    # sample: some of its alone records are the same steps as session records (a call's first occurrence).
    run_stage(
        "--stage", "answer", "--work", str(shipped_run), "--engine", tiny_engine.base_url,
        "--engine-model", tiny_engine.model, "--history-twins", "--out", str(tmp_path),
    )  # fmt: skip
    rows, trained = generations(tmp_path), generations(shipped_run / "out")
    asked, twins = rows[: len(trained)], rows[len(trained) :]
    call = ("split", "episode", "step", "prompt_format", "target")
    assert [[r[k] for k in call] for r in asked] == [[r[k] for k in call] for r in trained]
    sessions = [r for r in asked if r["prompt_format"] == "mirrorapi-session-v2"]
    assert sessions and all(r["history_twin"] for r in twins) and not any("history_twin" in r for r in asked)
    dataset = load_from_disk(str(shipped_run / "data" / "simulator"))
    what = ("split", "source", "episode", "step", "category", "tool", "api", "arguments", "target")
    assert [{k: r[k] for k in what} for r in twins] == [{k: r[k] for k in what} for r in sessions]
    for twin in twins:  # asked as the build's one stateless record of that call
        same_call = [
            r for r in dataset[twin["split"]]
            if r["prompt_format"] == "mirrorapi-v2" and (r["api"], r["arguments"]) == (twin["api"], twin["arguments"])
        ]  # fmt: skip
        assert len(same_call) == 1 and twin["prompt_format"] == "mirrorapi-v2"

    output = run_stage(
        "--stage", "score", "--work", str(shipped_run), "--generations", str(tmp_path / "generations.jsonl.xz")
    )
    scores = json.loads((tmp_path / "fidelity-offline.json").read_text())
    assert set(scores) == {"mirrorapi-v2", "mirrorapi-session-v2", "history"}
    history = scores["history"]
    gap = history.pop("with_minus_without")  # the first pass minus the second, on the calls each simulated
    # The values the recorded history showed that each real answer repeats: the same calls, so the same values, for
    # the answers with and without their history and the nearest example, each repeating its share of them.
    consistency = history.pop("consistency")
    assert set(consistency) == {"with_history", "without_history", "nearest_example"}
    assert len({(c["steps"], c["values_carried"]) for c in consistency.values()}) == 1
    assert all(c["values_repeated"] <= c["values_carried"] for c in consistency.values())
    calls = {name: sum(part["calls"] for part in report.values()) for name, report in history.items()}
    assert calls == {"with_history": len(sessions), "without_history": len(sessions)}
    with_, without = (history[name]["simulated"]["overall"] for name in ("with_history", "without_history"))
    assert gap["overall"]["rouge_l"]["difference"] == pytest.approx(
        with_["simulated"]["rouge_l"] - without["simulated"]["rouge_l"], abs=0.02
    )
    assert set(gap) == {"overall", *history["with_history"]["simulated"]["per_source"]}
    # The same figures in the stage's output, one line per prompt format and source, and per source for history.
    rouge = gap["overall"]["rouge_l"]
    assert f"history, overall: with minus without ROUGE-L {rouge['difference']:+.1f} [" in output
    assert (
        "history, consistency (values of the recorded history the real answer repeats, repeated): with history "
        in output
    )
    alone = scores["mirrorapi-v2"]["simulated"]["overall"]
    assert f"mirrorapi-v2, all sources, n {alone['n']}: ROUGE-L {alone['simulated']['rouge_l']:.1f} / " in output
    assert sum(
        part["calls"] for fmt in ("mirrorapi-v2", "mirrorapi-session-v2") for part in scores[fmt].values()
    ) == len(asked)


def test_the_answer_stage_asks_only_the_named_sources_of_the_same_sample(
    shipped_run, tiny_engine, tmp_path, entry_script, run_stage
):
    # --sources: the sample's records of those sources, in the sample's order, and no other
    run_stage(
        "--stage", "answer", "--work", str(shipped_run), "--engine", tiny_engine.base_url,
        "--engine-model", tiny_engine.model, "--sources", "tau-bench", "api-bank", "--out", str(tmp_path),
    )  # fmt: skip
    call = ("split", "source", "episode", "step", "prompt_format", "target")
    named = ("tau-bench", "api-bank")
    wanted = [[r[k] for k in call] for r in generations(shipped_run / "out") if r["source"] in named]
    assert wanted and [[r[k] for k in call] for r in generations(tmp_path)] == wanted

    with pytest.raises(SystemExit, match="of tau_bench") as refused:  # a misspelt source asks nothing
        entry_script("scripts/train_shipped_models.py").main(
            ["--tiny", "--stage", "answer", "--work", str(shipped_run), "--engine", tiny_engine.base_url,
             "--engine-model", tiny_engine.model, "--sources", "tau_bench", "--out", str(tmp_path / "none")]
        )  # fmt: skip
    assert isinstance(refused.value.code, str)  # exit status 1, the message on stderr
    assert not (tmp_path / "none").exists()


def test_unseen_apis_shown_an_example_are_answered_and_scored_apart(shipped_run, tiny_engine, tmp_path, run_stage):
    # --splits test_ood_shown: unseen APIs' calls asked with an example from test_ood's other half of episodes, as
    # a server whose cache holds recorded calls of those APIs asks them; scored apart, against the nearest example
    # of that cache (the training calls have none of an unseen API)
    run_stage(
        "--stage", "answer", "--work", str(shipped_run), "--engine", tiny_engine.base_url,
        "--engine-model", tiny_engine.model, "--splits", "test_ood_shown", "--out", str(tmp_path),
    )  # fmt: skip
    rows = generations(tmp_path)
    dataset = load_from_disk(str(shipped_run / "data" / "simulator"))
    strata = {(r["source"], r["prompt_format"]) for r in dataset["test_ood_shown"]}
    assert {r["split"] for r in rows} == {"test_ood_shown"} and {
        (r["source"], r["prompt_format"]) for r in rows
    } == strata
    run_stage("--stage", "score", "--work", str(shipped_run), "--generations", str(tmp_path / "generations.jsonl.xz"))
    scores = json.loads((tmp_path / "fidelity-offline.json").read_text())
    assert set(scores) == {"test_ood_shown"}
    assert sum(part["calls"] for report in scores["test_ood_shown"].values() for part in report.values()) == len(rows)
    coverage = [report["simulated"]["overall"]["baseline_coverage"] for report in scores["test_ood_shown"].values()]
    assert any(coverage)  # the other half's calls are examples of those APIs; no training call is


def test_the_judge_stage_scores_an_adapter_as_the_train_stage_scores_it(
    shipped_run, tiny_model_dir, tmp_path, run_stage
):
    # the judge the train stage trained, scored again without training (as an adapter trained on another machine
    # is): the same verdicts on the same held-out answers, and the same agreement table
    adapter = shipped_run / "judge"
    weights = (adapter / "adapter_model.safetensors").read_bytes()
    run_stage(
        "--stage", "judge", "--work", str(shipped_run), "--base", str(tiny_model_dir), "--adapter", str(adapter),
        "--out", str(tmp_path),
    )  # fmt: skip

    def verdicts(folder: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (folder / "judge_scores.jsonl").read_text().splitlines()]
        return [(r["id"], r["label"], r["trained"], r["base"]) for r in rows]

    assert verdicts(tmp_path) == verdicts(shipped_run / "out")
    report = json.loads((shipped_run / "out" / "report.json").read_text())
    assert json.loads((tmp_path / "judge-agreement.json").read_text()) == report["judge"]["offline_agreement"]
    assert (adapter / "adapter_model.safetensors").read_bytes() == weights  # nothing trained


def test_the_answer_judge_and_decisions_stages_need_an_adapter(tiny_model_dir, tmp_path):
    work, base = ["--work", str(tmp_path)], ["--base", str(tiny_model_dir)]

    def refusal(*argv: str) -> str:
        return run_script(*argv, exit_code=2).stderr

    assert "--adapter" in refusal("--stage", "answer", *work, *base)
    assert "--engine-model" in refusal("--stage", "answer", *work, "--engine", "http://127.0.0.1:9/v1")
    assert "the judge stage needs --adapter" in refusal("--stage", "judge", *work, *base)
    assert "the decisions stage needs --adapter" in refusal("--stage", "decisions", *work, *base)
    assert "--base" in refusal("--stage", "decisions", *work, "--adapter", str(tmp_path))


def response_chars(completion: list[dict]) -> int:
    response = json.loads(completion[0]["content"])["response"]
    return len(response if isinstance(response, str) else json.dumps(response, separators=(",", ":")))


def data_options(work: Path) -> dict:
    return {
        kind: json.loads((work / "data" / kind / "stats.json").read_text())["options"]
        for kind in ("simulator", "judge")
    }


def test_the_data_stage_passes_its_options_to_both_builders(shipped_run, tmp_path, run_stage):
    # by default the shipped models' data: both splits seeded 42, tau-bench's judge answers four times, a tenth of
    # the judge's queries held out
    options = data_options(shipped_run)
    assert options["simulator"]["seed"] == 42 and options["simulator"]["test_ood_shown"] is True
    assert (options["judge"]["seed"], options["judge"]["test_fraction"]) == (42, 0.1)
    assert options["simulator"]["split_rule"] == options["judge"]["split_rule"] == "shuffled"
    assert options["judge"]["repeat_sources"] == ["tau-bench/airline=4"] and options["judge"]["balance"] == "drop"
    # the examples the shipped simulator trained on: shrunk to 600 characters within 1,024
    assert (options["simulator"]["few_shot_char_budget"], options["simulator"]["few_shot_response_chars"]) == (
        1024,
        600,
    )
    run_stage(
        "--stage", "data", "--work", str(tmp_path), "--target-response-chars", "200", "--seed", "7",
        "--judge-test-fraction", "0.3", "--few-shot-char-budget", "3000", "--few-shot-response-chars", "2000",
        "--split-rule", "grouped", "--judge-balance", "per-source",
    )  # fmt: skip
    options = data_options(tmp_path)
    assert options["simulator"]["seed"] == 7 and options["simulator"]["target_response_chars"] == 200
    assert options["simulator"]["split_rule"] == options["judge"]["split_rule"] == "grouped"
    assert (options["simulator"]["few_shot_char_budget"], options["simulator"]["few_shot_response_chars"]) == (
        3000,
        2000,
    )
    assert (options["judge"]["seed"], options["judge"]["test_fraction"], options["judge"]["balance"]) == (
        7,
        0.3,
        "per-source",
    )
    # the fixture's data stage shrank answers at the default 1,024 characters: the samples' longest (a tau-bench
    # user, 1,866 characters) keeps its keys with values cut to "..." (mirrorapi.few_shot.shrink_response: "about"
    # that many); at 200 less of it is left
    longest = {
        chars: max(map(response_chars, load_from_disk(str(work / "data" / "simulator"))["train"]["completion"]))
        for chars, work in ((1024, shipped_run), (200, tmp_path))
    }
    assert 800 < longest[1024] <= 1100 and longest[200] < longest[1024]


def test_the_decisions_stage_asks_the_answer_stage_s_records_against_their_real_outcomes(
    shipped_run, tiny_model_dir, tmp_path, run_stage
):
    from mirrorapi.evaluation.fidelity.metrics import is_error

    run_stage(
        "--stage", "decisions", "--work", str(shipped_run), "--base", str(tiny_model_dir),
        "--adapter", str(shipped_run / "simulator"), "--answers", "8", "--history-twins", "--out", str(tmp_path),
    )  # fmt: skip
    found = json.loads((tmp_path / "decisions.json").read_text())
    records = found["records"]
    asked = [r for r in records if not r["history_twin"]]
    trained = generations(shipped_run / "out")[:8]  # the train stage's sample, in its order
    assert [(r["split"], r["episode"], r["step"], r["prompt_format"]) for r in asked] == [
        (r["split"], r["episode"], r["step"], r["prompt_format"]) for r in trained
    ]
    sessions = [r for r in asked if "session" in r["prompt_format"]]
    twins = [r for r in records if r["history_twin"]]
    assert sessions and [(r["episode"], r["step"]) for r in twins] == [(r["episode"], r["step"]) for r in sessions]
    pairs = {
        (p["source"], p["episode"], p["step"]): p
        for p in map(json.loads, (REPO / "data/samples/pairs.jsonl").read_text().splitlines())
    }
    for r in records:
        assert r["failed"] == is_error(pairs[(r["source"], r["episode"], r["step"])]["response"])
        assert 0.0 <= r["p_failure"] <= 1.0
        earlier = [
            p for (source, episode, step), p in pairs.items() if (source, episode) == (r["source"], r["episode"])
        ]
        assert r["after_a_failure"] == any(is_error(p["response"]) for p in earlier if p["step"] < r["step"])
    assert any(r["after_a_failure"] for r in records) and not all(r["after_a_failure"] for r in records)
    for group, parts in found["tables"].items():
        chosen = [r for r in records if not r["cache_hit"] and group.startswith(r["prompt_format"])]
        chosen = [r for r in chosen if r["history_twin"] == group.endswith("(history twins)")]
        assert parts["overall"]["calls"] == len(chosen)
        assert parts["overall"]["failures"] == sum(r["failed"] for r in chosen)
        states = [state for state in ("after a failure", "no failure before") if state in parts]
        assert sum(parts[state]["calls"] for state in states) == len(chosen)  # the session's state splits the calls
        assert list(parts)[0] == "overall" and list(parts)[-len(states) :] == states  # then sources, then states
        answered = [t["answered"] for t in parts["overall"]["thresholds"]]
        assert answered == sorted(answered, reverse=True)  # a higher threshold never answers more failures


def test_without_the_shared_data_only_tiny_reads_the_samples(tmp_path, entry_script, capsys, monkeypatch):
    # No ../shared/data (a lent machine, a fresh clone): the data stage does not quietly build from data/samples,
    # which would train the shipped models on a few samples; it names the flags to give, in one line, status 2
    script = entry_script("scripts/train_shipped_models.py")
    monkeypatch.setattr(script, "SHARED", tmp_path / "no-shared")
    for stage in ("data", "all", "score"):
        with pytest.raises(SystemExit) as refused:
            script.main(["--stage", stage, "--work", str(tmp_path / "work"), "--base", str(tmp_path)])
        assert refused.value.code == 2
        error = capsys.readouterr().err
        assert len(error.strip().splitlines()) == 1 and "--pairs --tools" in error and "--tiny" in error
    assert not (tmp_path / "work").exists()


def test_scoring_against_other_pairs_than_the_data_s_is_one_line(shipped_run, tmp_path, run_stage, capsys):
    # the pairs read hold none of the data stage's calls (the data built from other pairs): one line, status 2,
    # not a KeyError's traceback
    one_pair = tmp_path / "one.jsonl"
    one_pair.write_text((REPO / "data/samples/pairs.jsonl").read_text().splitlines()[0] + "\n")
    with pytest.raises(SystemExit) as refused:
        run_stage(
            "--stage", "score", "--work", str(shipped_run), "--pairs", str(one_pair),
            "--generations", str(shipped_run / "out" / "generations.jsonl.xz"),
        )  # fmt: skip
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "score with the --pairs the data stage built from" in error


def test_a_failed_training_still_hands_back_what_trained(shipped_run, tiny_model_dir, tmp_path, run_stage):
    # the simulator's training fails in its process (a dataset folder that is not there: only training/sft.py
    # finds it); the judge trains on: its adapter, the logs and a report naming the failure are in --out, and the
    # stage ends with the failure
    work, out = tmp_path / "work", tmp_path / "out"
    shutil.copytree(shipped_run / "data", work / "data")
    with pytest.raises(SystemExit, match="training failed: simulator"):
        run_stage(
            "--stage", "train", "--work", str(work), "--base", str(tiny_model_dir), "--out", str(out),
            "--simulator-set", f"dataset_path={tmp_path / 'no-such-data'}",
        )  # fmt: skip
    assert {"judge-adapter.tar", "logs.tar.xz", "report.json", "judge_scores.jsonl"} <= {p.name for p in out.iterdir()}
    assert not (out / "simulator-adapter.tar").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["failed"]["training"] == ["simulator"]
    assert any("dataset folder not found" in line for line in report["failed"]["log_tails"]["simulator"])
    assert report["judge"]["metrics"]["steps"] == 3 and report["judge"]["offline_agreement"]
    with tarfile.open(out / "logs.tar.xz") as tar:
        assert {"logs/simulator.log", "logs/judge.log"} <= set(tar.getnames())


def test_several_runs_of_one_call_pack_within_what_a_lent_machine_hands_back(
    shipped_run, tiny_model_dir, tmp_path, run_stage, monkeypatch
):
    # two runs of one call, each --pack'ed into one file of $OUT: $OUT holds 2 files, each archive its run's results
    # (under a folder named after it), the same files as its --out
    out = tmp_path / "OUT"
    monkeypatch.setenv("OUT", str(out))
    base = ["--work", str(shipped_run), "--base", str(tiny_model_dir)]
    run_stage(
        "--stage", "judge", *base, "--adapter", str(shipped_run / "judge"), "--out", str(tmp_path / "a"),
        "--pack", str(out / "a.tar"),
    )  # fmt: skip
    run_stage(
        "--stage", "answer", *base, "--adapter", str(shipped_run / "simulator"), "--answers", "2",
        "--out", str(tmp_path / "b"), "--pack", str(out / "b.tar"),
    )  # fmt: skip
    assert sorted(p.name for p in out.rglob("*")) == ["a.tar", "b.tar"]
    for name in ("a", "b"):
        with tarfile.open(out / f"{name}.tar") as tar:
            packed = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        assert packed == {f"{name}/{p.name}": p.read_bytes() for p in (tmp_path / name).iterdir()}
    # a run writing its files into a sibling folder of $OUT is counted with everything under $OUT: 7 files of an
    # earlier run there, and this run's 2 more are over 8; said as they land
    (out / "seed1").mkdir()
    for i in range(7):
        (out / "seed1" / f"file{i}").write_text("x")
    output = run_stage(
        "--stage", "judge", *base, "--adapter", str(shipped_run / "judge"), "--out", str(out / "c"),
    )  # fmt: skip
    assert f"WARNING: {out} holds 11 files" in output


def test_recipe_settings_are_checked_before_anything_trains(tiny_model_dir, tmp_path):
    # a key training/sft.py does not take, or a value its key's type refuses: one line, status 2, before anything
    # trains and nothing written (it failed only in the training process, ~20 s in, after the other kind trained whole)
    work = ["--stage", "train", "--work", str(tmp_path / "work"), "--base", str(tiny_model_dir)]
    error = run_script(*work, "--simulator-set", "no_such_key=1", exit_code=2).stderr
    assert error.strip().splitlines() == [
        "train_shipped_models.py: error: --simulator-set no_such_key=1: training/sft.py has no key 'no_such_key' "
        "(`training/sft.py --help`)"
    ]
    error = run_script(*work, "--judge-set", "max_steps=abc", exit_code=2).stderr
    assert "'abc' is not a valid value of max_steps" in error
    assert not (tmp_path / "work").exists()


def test_each_stage_writes_to_its_own_folder_by_default(shipped_run, tiny_model_dir, tmp_path, run_stage):
    # the answer stage after a train stage, without --out: its answers in WORK/answers, the train stage's
    # generations in WORK/out left as they were (they were overwritten: both defaulted to WORK/out)
    work = tmp_path / "work"
    for folder in ("data", "out"):
        shutil.copytree(shipped_run / folder, work / folder)
    trained = (work / "out" / "generations.jsonl.xz").read_bytes()
    run_stage(
        "--stage", "answer", "--work", str(work), "--base", str(tiny_model_dir),
        "--adapter", str(shipped_run / "simulator"), "--answers", "2",
    )  # fmt: skip
    assert (work / "out" / "generations.jsonl.xz").read_bytes() == trained
    assert len(generations(work / "answers")) == 2


def test_the_train_stage_answers_the_answer_stage_s_sample(shipped_run, tiny_model_dir, tmp_path, run_stage):
    # --answers (and --splits, --sources, --history-twins) choose the train stage's records as the answer stage's:
    # the sample's first 3 (the train stage took the whole sample, whatever was asked)
    work = tmp_path / "work"
    shutil.copytree(shipped_run / "data", work / "data")
    run_stage(
        "--stage", "train", "--kinds", "simulator", "--work", str(work), "--base", str(tiny_model_dir),
        "--answers", "3", "--simulator-set", "max_steps=1",
    )  # fmt: skip
    call = ("split", "episode", "step", "prompt_format")
    answered = generations(work / "out")
    assert [[r[k] for k in call] for r in answered] == [
        [r[k] for k in call] for r in generations(shipped_run / "out")[:3]
    ]
    assert len(json.loads((work / "out" / "decisions.json").read_text())["records"]) == 3


def test_a_stage_ends_with_its_results_and_their_sizes(shipped_run, tiny_model_dir, tmp_path, run_stage):
    # the closing lines: the folder, each file with its size, and a warning line once over a lent machine's limits
    out = tmp_path / "out"
    argv = ["--stage", "judge", "--work", str(shipped_run), "--base", str(tiny_model_dir)]
    output = run_stage(*argv, "--adapter", str(shipped_run / "judge"), "--out", str(out))
    closing = output.splitlines()[-4:-1]  # then the stage's `done:` line
    assert closing[0].endswith(f"] results: {out}")
    kib = {
        name: f"{(out / name).stat().st_size / 1024:.1f} KiB"
        for name in ("judge-agreement.json", "judge_scores.jsonl")
    }
    assert [line.split("] ", 1)[1] for line in closing[1:]] == [f"  {name} {size}" for name, size in kib.items()]
    assert "WARNING" not in output
    for i in range(8):
        (out / f"extra{i}").write_text("x")
    output = run_stage(*argv, "--adapter", str(shipped_run / "judge"), "--out", str(out))
    assert f"WARNING: {out} holds 10 files" in output.splitlines()[-2]
