"""API-Bank levels 1-2 (mirrorapi/evaluation/benchmarks/apibank/) against API-Bank's own dialogues and rules.

Expected values come from API-Bank (AlibabaResearch/DAMO-ConvAI api-bank/,
commit 5c38bb7d1d78c7a7f12aa415d620d6305dbe2078):
its annotated call is right by definition, a call with a changed argument is wrong, the per-API rules
(apis/*.py `check_api_call_correctness`) decide the edge cases below, and an annotated response has ROUGE-L 1.
"""

import contextlib
import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from harness.processes import free_port, serve_in_thread
from mirrorapi.evaluation import benchmark
from mirrorapi.evaluation.benchmarks import apibank
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.serving.app import create_app
from mirrorapi.serving.cache import ResponseCache, import_pairs
from mirrorapi.serving.config import ServerSettings
from mirrorapi.tools import ToolRegistry

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "apibank"
TOOLS = ROOT / "data" / "samples" / "tools"


def result(api: str, inputs: dict | None, output, exception=None) -> dict:
    return {"api_name": api, "input": inputs, "output": output, "exception": exception}


def test_the_shipped_dialogues_are_api_banks_levels_1_and_2():
    # API-Bank's lv1-lv2-samples: 214 level-1 dialogues with 389 API turns, 50 level-2 with 119 (45 ToolSearcher).
    level1, level2 = apibank.load_dialogues(DATA, 1), apibank.load_dialogues(DATA, 2)
    assert (len(level1), len(level2)) == (214, 50)
    calls = [sum(t["role"] == "API" for d in ds for t in d["turns"]) for ds in (level1, level2)]
    assert calls == [389, 119]
    # API-Bank's own sample construction (evaluator.py: an API turn followed by another API turn is one more call
    # sample) gives the paper's evaluation counts: 399 Call and 135 Retrieve+Call API calls.
    samples = [[s for d in ds for s in apibank.samples_of(d, level)] for level, ds in ((1, level1), (2, level2))]
    assert [sum(s.kind == "call" for s in level) for level in samples] == [399, 135]
    assert "Apache License" in (DATA / "LICENSE").read_text()


def test_response_samples_are_the_ai_turns_right_after_a_call():
    # API-Bank's evaluator scores the turn after an API turn as a response only when it is the AI's
    # (evaluator.py: `elif sample.ground_truth['role'] == 'AI'`); four level-1 dialogues have the user's turn
    # there ("Thank you."), which is no sample. Counted on the dialogues by that rule alone.
    for level in (1, 2):
        dialogues = apibank.load_dialogues(DATA, level)
        expected = sum(
            1
            for d in dialogues
            for before, after in zip(d["turns"], d["turns"][1:], strict=False)
            if before["role"] == "API" and after["role"] == "AI"
        )
        responses = [s for d in dialogues for s in apibank.samples_of(d, level) if s.kind == "response"]
        assert all(s.truth["role"] == "AI" for s in responses)
        assert len(responses) == expected
    user_after_call = sum(
        1
        for d in apibank.load_dialogues(DATA, 1)
        for before, after in zip(d["turns"], d["turns"][1:], strict=False)
        if before["role"] == "API" and after["role"] == "User"
    )
    assert user_after_call == 4  # the case this test is about is in the data


def test_parse_call_follows_api_banks_argument_pattern():
    assert apibank.parse_call("Sure. [AddAlarm(token='z9x8', time='2021-10-14 08:00:00')] done") == (
        "AddAlarm",
        {"token": "z9x8", "time": "2021-10-14 08:00:00"},
    )
    assert apibank.parse_call('[Calculator(formula="(1+2)*3")]') == ("Calculator", {"formula": "(1+2)*3"})
    assert apibank.parse_call("[GetToday()]") == ("GetToday", {})
    assert apibank.parse_call("I will add an alarm.") is None


@pytest.mark.parametrize(
    "api, predicted, annotated, correct",
    [
        # add_agenda.py: content by word overlap (Jaccard > 0.5), time and location exact.
        (
            "AddAgenda",
            {"content": "Meeting with client A", "time": "2023-07-15 14:00:00", "location": "Client"},
            {"content": "Meeting with Client A", "time": "2023-07-15 14:00:00", "location": "Client"},
            True,
        ),  # 3/5
        (
            "AddAgenda",
            {"content": "Meeting client", "time": "2023-07-15 14:00:00", "location": "Client"},
            {"content": "Meeting with Client A", "time": "2023-07-15 14:00:00", "location": "Client"},
            False,
        ),  # 1/5
        # add_reminder.py: the same overlap after lower-casing.
        (
            "AddReminder",
            {"content": "CALL MOM", "time": "2023-03-16 14:00:00", "token": "x"},
            {"content": "call mom", "time": "2023-03-16 14:00:00", "token": "y"},
            True,
        ),
        # calculator.py: the formula without spaces.
        ("Calculator", {"formula": "(1 + 2) * 3"}, {"formula": "(1+2)*3"}, True),
        # query_stock.py: the stock code upper-cased and stripped.
        ("QueryStock", {"stock_code": " sq ", "date": "2022-03-31"}, {"stock_code": "SQ", "date": "2022-03-31"}, True),
        # send_email.py: receiver case-insensitive, subject exact.
        (
            "SendEmail",
            {"receiver": "A@B.COM", "subject": "Hi", "content": "x"},
            {"receiver": "a@b.com", "subject": "Hi", "content": "x"},
            True,
        ),
        (
            "SendEmail",
            {"receiver": "a@b.com", "subject": "hi", "content": "x"},
            {"receiver": "a@b.com", "subject": "Hi", "content": "x"},
            False,
        ),
        # delete_scene.py: the name stripped and lower-cased, then output and exception equal.
        ("DeleteScene", {"name": " Morning Routine "}, {"name": "morning routine"}, True),
        ("DeleteScene", {"name": "Evening Routine"}, {"name": "morning routine"}, False),
        # the default (e.g. add_alarm.py): input exactly equal.
        (
            "AddAlarm",
            {"token": "t", "time": "2021-10-14 8:00:00"},
            {"token": "t", "time": "2021-10-14 08:00:00"},
            False,
        ),
    ],
)
def test_api_banks_per_api_rules(api, predicted, annotated, correct):
    assert apibank.call_is_correct(result(api, predicted, "out"), result(api, annotated, "out")) is correct


def test_special_outputs_of_api_banks_rules():
    # delete_agenda.py: when both succeed the time alone decides (the token may differ).
    gt = result("DeleteAgenda", {"token": "a", "content": "x", "time": "2023-01-01 10:00:00"}, "success")
    other = {"token": "b", "content": "y", "time": "2023-01-01 10:00:00"}
    assert apibank.call_is_correct(result("DeleteAgenda", other, "success"), gt)
    # get_today.py: any output without exception, called without arguments.
    assert apibank.call_is_correct(result("GetToday", None, "2023-11-25"), result("GetToday", None, "2023-03-31"))
    # ...and only so: its rule asks `response['input'] == None` too.
    assert not apibank.call_is_correct(
        result("GetToday", {"date": "2023-03-31"}, "2023-03-31"), result("GetToday", None, "2023-03-31")
    )
    # register_user.py: a random token, so only "no output where none was recorded" is checked.
    gt = result("RegisterUser", {"username": "u", "password": "p", "email": "e"}, {"token": "abc"})
    assert apibank.call_is_correct(result("RegisterUser", gt["input"], {"token": "other"}), gt)
    # an exception where none was recorded is wrong; a missing argument is wrong (API-Bank: KeyError).
    assert not apibank.call_is_correct(
        result("AddAlarm", gt["input"], None, "boom"), result("AddAlarm", gt["input"], None)
    )
    assert not apibank.call_is_correct(
        result("QueryStock", {"date": "2022-03-31"}, 1),
        result("QueryStock", {"stock_code": "SQ", "date": "2022-03-31"}, 1),
    )


# ------------------------------------------------------------------------------- replayed model, real HTTP
def changed(params: dict) -> dict:
    """The annotated arguments with the first one replaced by a value no recording holds (so: a wrong call)."""
    first = next(iter(params))
    return {**params, first: "zzz-changed-value"}


@contextlib.contextmanager
def replayed_model(replies: dict[str, str]):
    """A stand-in for an OpenAI-compatible engine (a recorded model): the reply recorded for the exact messages."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        messages = (await request.json())["messages"]
        text = replies[json.dumps(messages, sort_keys=True)]
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "replay",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    port = free_port()
    with serve_in_thread(app, port, access_log=False) as url:
        yield url + "/v1"


@contextlib.contextmanager
def replay_server(tmp_path: Path):
    """Our virtual server in replay mode whose cache holds API-Bank's recorded calls (`write_recorded_pairs`)."""
    dialogues = apibank.load_dialogues(DATA, 1) + apibank.load_dialogues(DATA, 2)
    pairs = tmp_path / "pairs.jsonl"
    apibank.write_recorded_pairs(dialogues, apibank.tools_of(TOOLS), pairs)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    report = import_pairs(cache, pairs, ToolRegistry.load([TOOLS]))
    cache.close()
    assert report["unresolved_apis"] == 0
    port = free_port()
    settings = ServerSettings(
        api_base="http://127.0.0.1:9/v1",
        model="none",
        mode="replay",
        tools_folder=[TOOLS],
        cache_path=tmp_path / "cache.sqlite",
        log_level="warning",
        port=port,
    )
    with serve_in_thread(create_app(settings), port, timeout=60, access_log=False) as url:
        yield url + "/virtual"


def as_written(api: str, params: dict) -> str:
    """A call as a model writes it for API-Bank's parser: list values (recorded as strings like "['a', 'b']")
    unquoted, which its pattern `(\\w+)\\s*=\\s*(\\[.*\\])` reads back whole; other values quoted."""
    return "[{}({})]".format(
        api, ", ".join(f"{k}={v}" if v.startswith("[") else f"{k}='{v}'" for k, v in params.items())
    )


def test_a_replayed_model_scores_what_api_bank_defines(tmp_path):
    limit = {1: 12, 2: 4}
    descriptions = apibank.load_descriptions(DATA)
    replies, is_right, calls = {}, {}, []
    for level, count in limit.items():
        for dialogue in apibank.load_dialogues(DATA, level)[:count]:
            for i, sample in enumerate(apibank.samples_of(dialogue, level)):
                key = json.dumps(apibank.build_messages(sample, descriptions), sort_keys=True)
                truth = sample.truth
                if sample.kind == "response":
                    replies[key] = truth["text"]
                    continue
                calls.append(key)
                if key in replies:  # API-Bank's repeated call sample (an API turn right after one): same reply
                    continue
                if i % 4 == 2 and truth["param_dict"]:  # every other call sample: a changed argument
                    replies[key], is_right[key] = as_written(truth["api_name"], changed(truth["param_dict"])), False
                else:
                    # API-Bank compares the typed input: a list-typed recorded input (AddMeeting's attendees)
                    # never equals the string its parser reads, so even the annotated call is wrong there.
                    lists = any(isinstance(v, list) for v in truth["result"]["input"].values())
                    replies[key] = as_written(truth["api_name"], truth["param_dict"])
                    is_right[key] = not lists
    right = sum(is_right[key] for key in calls)
    wrong = len(calls) - right
    assert right and wrong
    with replay_server(tmp_path) as server, replayed_model(replies) as engine:
        settings = apibank.Settings(
            data=DATA, tools_folder=TOOLS, server=server, base_urls=[engine], model="replay", levels=(1, 2), limit=None
        )
        rows = []
        for level, count in limit.items():
            settings.levels, settings.limit = (level,), count
            rows += apibank.evaluate(settings)
    summary = apibank.summarize(rows)
    assert sum(s["correct"] for s in summary.values()) == right
    assert sum(s["calls"] for s in summary.values()) == right + wrong
    assert summary[1]["rouge_l"] == summary[2]["rouge_l"] == 100.0
    assert summary[1]["dialogues"] == 12 and summary[2]["dialogues"] == 4
    changed_calls = [r for r in rows if r["kind"] == "call" and "zzz-changed-value" in r["output"]]
    assert changed_calls and all(r["result"]["exception"] for r in changed_calls)  # the replay server's miss
    report = apibank.report_markdown(summary, settings)
    assert "| Call (level 1) | Retrieve+Call (level 2) | Response ROUGE-L |" in report
    assert "- level 1: 12 of 214 dialogues" in report and "(399 call samples in the whole level)" in report
    assert "- level 2: 4 of 50 dialogues" in report and "(135 call samples in the whole level)" in report

    # The benchmark report includes a finished run written to <out>/apibank (API-Bank's table, counts, settings).
    apibank.write_report(rows, settings, tmp_path / "bench" / "apibank")
    judge = JudgeSettings(base_urls=["http://127.0.0.1:9/v1"], model="judge")
    bench = benchmark.write_report(tmp_path / "bench", [], "", {}, judge, [], {}, 1, {}).read_text(encoding="utf-8")
    assert "## API-Bank (levels 1-2) on the virtual server" in bench
    assert "| Call (level 1) | Retrieve+Call (level 2) | Response ROUGE-L |" in bench
    assert "- level 1: 12 of 214 dialogues" in bench  # built from the run's report.json, as its report.md


def _level_one(dialogues: int) -> tuple[list, dict[str, str]]:
    """The samples of the first level-1 dialogues, and the recorded model's replies: each sample's truth."""
    descriptions = apibank.load_descriptions(DATA)
    samples = [s for d in apibank.load_dialogues(DATA, 1)[:dialogues] for s in apibank.samples_of(d, 1)]
    replies = {
        json.dumps(apibank.build_messages(s, descriptions), sort_keys=True): as_written(
            s.truth["api_name"], s.truth["param_dict"]
        )
        if s.kind == "call"
        else s.truth["text"]
        for s in samples
    }
    return samples, replies


def _resumable_settings(server: str, out, limit: int):
    return apibank.Settings(
        data=DATA,
        tools_folder=TOOLS,
        server=server,
        base_urls=["http://127.0.0.1:9/v1"],
        model="replay",
        levels=(1,),
        limit=limit,
        timeout=60.0,
        out=out,
        progress=False,
    )


def _answered_run(server: str, out, dialogues: int):
    """A run of the first `dialogues` level-1 dialogues into `out`, its model replying each sample's truth: (its
    settings, its rows, the rows its samples file holds)."""
    _, replies = _level_one(dialogues)
    settings = _resumable_settings(server, out, limit=dialogues)
    with replayed_model(replies) as engine:
        settings.base_urls = [engine]
        rows = apibank.evaluate(settings)
    return settings, rows, [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_a_run_resumes_from_its_samples_file(tmp_path):
    """Rows are appended to <out>/samples.jsonl as they come; a rerun asks the model only for the missing ones,
    and a failed model call is reported and asked again."""
    samples, replies = _level_one(2)
    out = tmp_path / "run"
    with replay_server(tmp_path) as server:
        settings = _resumable_settings(server, out, limit=2)
        failed = apibank.evaluate(settings)  # no engine there: every model call fails
        assert len(failed) == len(samples) and all("engine_error" in r for r in failed)
        assert apibank.summarize(failed)[1]["engine_errors"] == len(samples)
        assert not (out / "samples.jsonl").read_text()  # failed calls are not kept as done
        with replayed_model(replies) as engine:
            settings.base_urls = [engine]
            first = apibank.evaluate(settings)
        lines = (out / "samples.jsonl").read_text().splitlines()
        assert len(lines) == len(samples)
        (out / "samples.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # cut, as by a kill
        with replayed_model({}) as engine:  # knows no reply: every sample asked again fails
            settings.base_urls = [engine]
            partial = apibank.evaluate(settings)
        kept = {(r["level"], r["dialogue"], r["sample"]) for r in map(json.loads, lines[:3])}  # the whole lines
        assert {(r["level"], r["dialogue"], r["sample"]) for r in partial if "engine_error" not in r} == kept
        with replayed_model(replies) as engine:
            settings.base_urls = [engine]
            again = apibank.evaluate(settings)
        settings.base_urls, settings.model = ["http://127.0.0.1:9/v1"], "replay"
        resumed = apibank.evaluate(settings)  # all done: no model call at all
    assert [r["output"] for r in again] == [r["output"] for r in first] == [r["output"] for r in resumed]
    assert apibank.summarize(resumed)[1]["engine_errors"] == 0
    assert apibank.summarize(resumed) == apibank.summarize(first)
    # A report of fewer dialogues keeps the file's other rows (a later, larger run reuses them).
    settings.limit = 1
    apibank.write_report(apibank.evaluate(settings), settings, out)
    assert len((out / "samples.jsonl").read_text().splitlines()) == len(samples)
    assert "- level 1: 1 of 214 dialogues" in (out / "report.md").read_text()


def test_a_row_written_for_another_sample_under_the_same_number_is_asked_again(tmp_path):
    """A samples file of an earlier run whose rules numbered the samples otherwise (a33dde6 renumbered three
    dialogues): a row is reused only for the sample it was asked for, never scored against another's truth."""
    samples, _ = _level_one(1)
    out = tmp_path / "run"
    with replay_server(tmp_path) as server:
        settings, _, rows = _answered_run(server, out, 1)
        call = next(r for r in rows if r["kind"] == "call")
        response = next(r for r in rows if r["kind"] == "response")
        call["sample"], response["sample"] = response["sample"], call["sample"]
        (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        with replayed_model({}) as engine:  # knows no reply: a sample asked again fails
            settings.base_urls = [engine]
            again = apibank.evaluate(settings)
    assert {r["sample"] for r in again if "engine_error" in r} == {call["sample"], response["sample"]}
    assert all(r["kind"] == s.kind for r, s in zip(again, samples, strict=True))


def test_every_annotated_call_is_judged_by_api_bank_s_rule_for_its_sample_s_api(tmp_path):
    """Each annotated call of levels 1-2, executed on the replay server, judged as API-Bank's evaluator judges it:
    by the checker of the sample's API (evaluator.py: `tool_manager.init_tool(api_name)`), which for
    DeleteAccount, ForgotPassword and RegisterUser compares input, output and exception, though their recorded
    results name no API. API-Bank's checkers accept 379 of level 1's 399 call samples and 83 of the 90 of level 2
    that are not ToolSearcher's (its Translate needs googletrans online; the 21 and 7 others are the list-typed
    inputs and drifting outputs the module documents)."""
    import asyncio

    from mirrorapi.evaluation.benchmarks.apibank.execution import VirtualApiBank, truth_result

    async def judged(server: str) -> dict[int, list[bool]]:
        api = VirtualApiBank(server, apibank.tools_of(TOOLS), {}, apibank.parameter_types(DATA))
        verdicts: dict[int, list[bool]] = {1: [], 2: []}
        try:
            for level in (1, 2):
                for dialogue in apibank.load_dialogues(DATA, level):
                    for sample in apibank.samples_of(dialogue, level):
                        truth = sample.truth
                        if sample.kind != "call" or truth["api_name"] == "ToolSearcher":
                            continue
                        arguments = {k: str(v) for k, v in truth["param_dict"].items()}
                        executed = await api.execute(truth["api_name"], arguments)
                        verdicts[level].append(apibank.call_is_correct(executed, truth_result(truth)))
        finally:
            await api.http.close()
        return verdicts

    with replay_server(tmp_path) as server:
        verdicts = asyncio.run(judged(server))
    assert (len(verdicts[1]), len(verdicts[2])) == (399, 90)
    assert (sum(verdicts[1]), sum(verdicts[2])) == (379, 83)


def test_a_resumed_run_judges_its_earlier_calls_by_today_s_rules(tmp_path):
    """A samples file of an earlier run keeps each executed call (`result`); a rerun reuses the model's answers but
    judges the calls again, so a corrected rule (the one above) corrects an old run's accuracy without asking again."""
    out = tmp_path / "run"
    with replay_server(tmp_path) as server:
        settings, first, rows = _answered_run(server, out, 2)
        flipped = [{**r, "correct": not r["correct"]} if "result" in r else r for r in rows]
        assert any("result" in r for r in rows)
        (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flipped))
        settings.base_urls = ["http://127.0.0.1:9/v1"]  # no engine: nothing is asked again
        again = apibank.evaluate(settings)
    assert apibank.summarize(again) == apibank.summarize(first) and apibank.summarize(first)[1]["correct"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("turns"), "no list of turns"),
        (lambda d: d["turns"][6].update(result="ok"), "turn 6 is neither a User or AI turn"),
        (lambda d: d["turns"][6].update(api_name="AddAgendaX"), "AddAgendaX not in api_descriptions.json"),
    ],
)
def test_a_data_folder_api_bank_cannot_be_read_from_is_one_line_and_exit_2(
    eval_cli, tmp_path, capsys, change, message
):
    data = tmp_path / "apibank"
    data.mkdir()
    (data / "api_descriptions.json").write_text((DATA / "api_descriptions.json").read_text())
    dialogue = apibank.load_dialogues(DATA, 1)[0]
    assert dialogue["turns"][6]["role"] == "API"
    change(dialogue)
    (data / "level-1.jsonl").write_text(json.dumps(dialogue) + "\n")
    argv = ["--data", str(data), "--server", "http://127.0.0.1:9/virtual", "--base-url", "http://127.0.0.1:9/v1"]
    assert eval_cli("apibank")([*argv, "--model", "m", "--levels", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
