"""Sessions (issue 13): a call's earlier session calls reach the simulator's prompt and its cache key;
calls without a session behave as before, and the stateless cache never holds a session's answer."""

import json
import sqlite3

import pytest

from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records
from mirrorapi.models.catalogue import serving_settings
from mirrorapi.prompts.simulator_formats import (
    SESSION_FORMAT,
    history_line,
    select_history,
    simulator_messages,
    stateless_format,
)
from mirrorapi.records import read_pairs_jsonl
from mirrorapi.serving.cache import ResponseCache, import_pairs, open_cache
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.sessions import EMPTY_HISTORY, Session
from mirrorapi.serving.simulator import Simulator, simulator_identity
from mirrorapi.tools import ToolRegistry

from .conftest import store_settings

# A real API-Bank episode (data/samples/pairs.jsonl, api-bank-generated gen-00133): a login, then a
# call that carries the token it returned.
LOGIN = (
    "APIBank",
    "apibank_account",
    "GetUserToken",
    {"username": "JaneSmith", "password": "password"},
    {"error": "", "response": '{"token": "o8i7u6y5t4r3e2w1q0"}'},
)
BALANCE = ("APIBank", "apibank_finance", "QueryBalance", {"token": "o8i7u6y5t4r3e2w1q0"})
APPOINTMENT = {"patient_name": "John Smith", "date": "2023-08-27", "doctor_name": "Dr. Davis"}


def body(category, tool, api, arguments, **extra) -> dict:
    return {
        "category": category,
        "tool_name": tool,
        "api_name": api,
        "tool_input": json.dumps(arguments),
        "strip": "truncate",
        "toolbench_key": "",
        **extra,
    }


def test_history_is_newest_first_whole_calls_within_the_budget():
    lines = [history_line("t", "a", {"i": i}, "", "x" * 40) for i in range(5)]
    assert select_history(lines, max_calls=3, char_budget=10_000) == lines[:1:-1]
    one = len(lines[0])
    assert select_history(lines, max_calls=8, char_budget=2 * one + 1) == [lines[4], lines[3]]
    assert select_history(lines, max_calls=8, char_budget=one - 1) == []  # a call is never cut
    assert json.loads(lines[0]) == {
        "tool": "t",
        "api": "a",
        "request": {"i": 0},
        "answer": {"error": "", "response": "x" * 40},
    }


def test_session_prompt_carries_the_history(samples):
    doc = ToolRegistry.load([samples / "tools"]).resolve(*BALANCE[:3])
    login = history_line("apibank_account", "getusertoken", LOGIN[3], **LOGIN[4])
    first = simulator_messages(doc, BALANCE[3], fmt=SESSION_FORMAT, history=[])
    later = simulator_messages(doc, BALANCE[3], fmt=SESSION_FORMAT, history=[login])
    assert first[0] == later[0] and "session" in first[0]["content"]
    assert "newest first:\n(none)\n\nRequest:" in first[1]["content"]
    assert f"newest first:\n{login}\n\nRequest:\n" in later[1]["content"]
    assert later[1]["content"].index('o8i7u6y5t4r3e2w1q0\\"}') < later[1]["content"].index("Request:")
    with pytest.raises(ValueError, match="no session history"):
        simulator_messages(doc, BALANCE[3], history=[login])


def test_history_digest_names_the_whole_history():
    a, b, c = Session(keep=1), Session(keep=8), Session(keep=8)
    assert a.digest == EMPTY_HISTORY
    for session in (a, b):
        session.record("apibank_account", "getusertoken", LOGIN[3], **LOGIN[4])
        session.record("apibank_finance", "querybalance", BALANCE[3], "", "410.87")
    c.record("apibank_finance", "querybalance", BALANCE[3], "", "410.87")
    assert a.digest == b.digest != c.digest  # kept lines do not matter, every earlier call does
    assert len(a.lines) == 1 and a.steps == b.steps == 2
    assert a.history(8, 10_000).lines == [b.history(8, 10_000).lines[0]]
    # Nothing earlier to show, at a session's start or when no earlier call fits the budget: no history at all (the
    # call is the stateless one), not an empty list.
    assert Session(keep=8).history(8, 10_000) is None and c.history(8, 10) is None and c.history(8, 10_000)


def test_simulator_prompts_session_calls_in_the_session_format(samples, tmp_path):
    settings = load_settings(overrides={"tools_folder": [str(samples / "tools")]}, environ={})
    doc = ToolRegistry.load(settings.tools_folder).resolve(*BALANCE[:3])
    simulator = Simulator(engine=None, settings=settings)
    session = Session(keep=8)
    session.record("apibank_account", "getusertoken", LOGIN[3], **LOGIN[4])
    stateless = simulator.messages(doc, BALANCE[3])
    in_session = simulator.messages(doc, BALANCE[3], session.history(8, 4096))
    assert "Earlier calls" not in stateless[1]["content"]
    assert "JaneSmith" in in_session[1]["content"] and in_session[0] != stateless[0]
    identity = simulator_identity(settings, in_session=True)
    assert identity.startswith(f"{settings.model}@{SESSION_FORMAT},temperature=0,")
    assert identity.endswith(",history=8,history_chars=4096")


@pytest.mark.slow
def test_session_answers_are_stored_under_the_history_and_replay_identically(
    serve, simulator_engine, samples, tmp_path
):
    cache_path = tmp_path / "c.sqlite"
    login, balance = body(*LOGIN[:4]), body(*BALANCE)
    with serve(
        api_base=[simulator_engine.base_url],
        model=simulator_engine.model,
        cache_path=str(cache_path),
        engine_timeout=120,
        session_history=8,  # the tiny model trained on calls alone: its record alone would turn sessions off
    ) as server:
        header = {"X-Session-Id": "episode-1"}
        first = [server.client.post("/virtual", json=b, headers=header).json() for b in (login, balance)]
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 2, first
        # The same episode under another session id (here the body field): same history, same answers, hits.
        again = [server.virtual({**b, "session_id": "episode-2"}).json() for b in (login, balance)]
        assert again == first
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 2
        # The second call first in a new session: nothing earlier to show, so it is the stateless call (not the
        # session's answer after the login), simulated once and then the same answer alone, from the cache.
        fresh = server.client.post("/virtual", json=balance, headers={"X-Session-Id": "episode-3"}).json()
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 3
        assert server.virtual(balance).json() == fresh
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 3
        # Without a session, the login is the one the episodes began with.
        assert server.virtual(login).json() == first[0]
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 3

    db = sqlite3.connect(cache_path)
    rows = db.execute("SELECT tool, history, steps, provenance FROM entries WHERE history != ''").fetchall()
    assert [(tool, steps) for tool, _, steps, _ in rows] == [("apibank_finance", 1)]  # only the call after the login
    assert rows[0][1] != EMPTY_HISTORY
    assert rows[0][3].split(",")[0] == f"simulated:{simulator_engine.model}@{SESSION_FORMAT}"
    assert sorted(
        (tool, p.split(",")[0]) for tool, p in db.execute("SELECT tool, provenance FROM entries WHERE history = ''")
    ) == [
        ("apibank_account", f"simulated:{simulator_engine.model}@mirrorapi-v1"),
        ("apibank_finance", f"simulated:{simulator_engine.model}@mirrorapi-v1"),
    ]


def test_recorded_answer_wins_inside_a_session(serve, samples, engine_down, cache_location):
    cache = open_cache(cache_location)
    import_pairs(cache, samples / "pairs.jsonl", ToolRegistry.load([samples / "tools"]))
    cache.close()
    with serve(api_base=[engine_down], engine_retries=0, **store_settings(cache_location)) as server:
        headers = {"X-Session-Id": "s"}
        answers = [server.client.post("/virtual", json=body(*LOGIN[:4]), headers=headers).json() for _ in range(2)]
        assert answers == [LOGIN[4], LOGIN[4]]  # the real answer, whatever the history
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 2
        # A miss in a session with the engine down: an error observation, nothing stored or remembered.
        missing = server.client.post("/virtual", json=body(*BALANCE[:3], {"token": "nope"}), headers=headers).json()
        assert missing["error"].startswith("Failed to generate fake response")
    assert open_cache(cache_location).session_count() == 0


@pytest.mark.parametrize(
    ("server_format", "session_format"), [("mirrorapi-v1", SESSION_FORMAT), ("mirrorapi-v2", "mirrorapi-session-v2")]
)
def test_data_builder_renders_episodes_as_the_server_prompts_them(samples, tmp_path, server_format, session_format):
    """`--history K` training prompts == the prompts a server sends when the episode is replayed in a session;
    a `mirrorapi-v2` server prompts its session calls in `mirrorapi-session-v2` (JSON values, never escaped)."""
    episode = sorted(
        (p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )
    assert len(episode) == 4
    registry = ToolRegistry.load([samples / "tools"])
    options = SimulatorDataOptions(session_format, history=2, history_char_budget=4096, ood_fraction=0, id_fraction=0)
    splits, _ = build_simulator_records(episode, registry, options)
    records = {r["step"]: r for r in splits["train"]}
    settings = load_settings(
        overrides={"tools_folder": [str(samples / "tools")], "session_history": 2, "prompt_format": server_format},
        environ={},
    )
    simulator = Simulator(engine=None, settings=settings)
    assert simulator_identity(settings, in_session=True).split(",")[0] == f"{settings.model}@{session_format}"
    session = Session(keep=settings.session_history)
    for pair in episode:
        doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        served = simulator.messages(doc, pair["tool_input"], session.history(2, settings.session_char_budget))
        assert served == records[pair["step"]]["prompt"], pair["step"]
        session.record(doc.tool, doc.api, pair["tool_input"], **pair["response"], fmt=session_format)
    # The first call has no earlier call to show: the stateless call, as the server asks it, nothing said of a session.
    assert (
        records[0]["prompt_format"] == stateless_format(session_format)
        and records[1]["prompt_format"] == session_format
    )
    assert "Earlier calls" not in records[0]["prompt"][1]["content"]
    assert records[3]["prompt"][1]["content"].count('{"tool":') == 2  # K = 2 of the 3 earlier calls
    # The login's real answer, a JSON object in a string: a value in -v2's history, escaped in -v1's.
    token = '{"token":"o8i7u6y5t4r3e2w1q0"}' if session_format != SESSION_FORMAT else '\\"token\\"'
    assert token in records[1]["prompt"][1]["content"]


def test_the_related_rule_shows_the_calls_that_share_a_value_or_the_api():
    """gen-00133's real calls: the balance query carries the token the login answered, the appointment shares
    nothing with either, the cancellation names the id the appointment answered."""
    episode = [
        history_line("apibank_account", "getusertoken", LOGIN[3], **LOGIN[4]),
        history_line("apibank_finance", "querybalance", BALANCE[3], "", "410.87"),
        history_line("apibank_hospital", "appointmentregistration", APPOINTMENT, "", "56545338"),
    ]
    related = {
        "balance": select_history(episode[:1], related_to=("querybalance", BALANCE[3])),
        "appointment": select_history(episode[:2], related_to=("appointmentregistration", APPOINTMENT)),
        "cancel": select_history(episode, related_to=("cancelregistration", {"appointment_id": "56545338"})),
        "balance again": select_history(episode, related_to=("querybalance", {"token": "another"})),
    }
    assert related == {
        "balance": episode[:1],
        "appointment": [],
        "cancel": [episode[2]],
        "balance again": [episode[1]],
    }
    assert select_history(episode) == episode[::-1]  # the recent rule: every one
    # A short value relates nothing (a "10" or "en" is shared by chance); booleans and null never.
    short = history_line("apibank_finance", "querystock", {"stock_code": "ORC", "lang": "en"}, "", "10")
    assert select_history([short], related_to=("querybalance", {"page": 10, "lang": "en", "all": True})) == []
    assert select_history([short], related_to=("querybalance", {"code": "ORC"})) == [short]


def test_the_data_builder_and_the_server_apply_the_related_rule_alike(samples, tmp_path):
    episode = sorted(
        (p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )
    registry = ToolRegistry.load([samples / "tools"])
    fmt = "mirrorapi-session-v2"
    options = SimulatorDataOptions(fmt, history=8, history_rule="related", ood_fraction=0, id_fraction=0)
    records = {r["step"]: r for r in build_simulator_records(episode, registry, options)[0]["train"]}
    settings = load_settings(
        overrides={
            "tools_folder": [str(samples / "tools")],
            "prompt_format": "mirrorapi-v2",
            "session_history_rule": "related",
        },
        environ={},
    )
    simulator = Simulator(engine=None, settings=settings)
    session = Session(keep=settings.session_history)
    for pair in episode:
        doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        history = session.history(8, settings.session_char_budget, (doc.api, pair["tool_input"]))
        assert simulator.messages(doc, pair["tool_input"], history) == records[pair["step"]]["prompt"], pair["step"]
        session.record(doc.tool, doc.api, pair["tool_input"], **pair["response"], fmt=fmt)
    # The appointment relates to none of the earlier calls: the stateless call, as a session's first call is.
    assert [records[step]["prompt_format"] for step in range(4)] == ["mirrorapi-v2", fmt, "mirrorapi-v2", fmt]
    cancel = records[3]["prompt"][1]["content"]
    assert cancel.count('{"tool":') == 1 and "56545338" in cancel
    # A model trained on these records is served with the rule (its record's data options name it).
    stats = build_simulator_records(episode, registry, options)[1]
    assert serving_settings({"kind": "simulator", "dataset_stats": stats})["session_history_rule"] == "related"


@pytest.mark.parametrize("rule", ["recent", "related"])
def test_a_session_call_related_to_nothing_earlier_is_the_stateless_call(serve, engine_stub, samples, tmp_path, rule):
    """Through the server (a stub engine, which answers every call alike): after a recorded login, a call carrying
    its token is stored under the session's history; a stock price, which shares nothing with the session, and a list
    of airports, which has no argument to share, under the stateless key with the related rule."""
    cache_path = tmp_path / "c.sqlite"
    cache = open_cache(str(cache_path))
    import_pairs(cache, samples / "pairs.jsonl", ToolRegistry.load([samples / "tools"]))
    cache.close()
    agenda = {"token": LOGIN[4]["response"][11:29], "content": "Team sync", "time": "2023-09-12 14:00:00"}
    agenda |= {"location": "office"}
    stock = {"stock_code": "ZZZZ", "date": "2022-01-03"}
    with serve(cache_path=str(cache_path), api_base=[engine_stub()], session_history_rule=rule) as server:
        calls = [LOGIN[:4], ("APIBank", "apibank_agenda", "AddAgenda", agenda)]
        calls += [("APIBank", "apibank_finance", "QueryStock", stock)]
        calls += [("TauBench", "taubench_airline", "list_all_airports", {})]
        for call in calls:
            assert server.client.post("/virtual", json=body(*call), headers={"X-Session-Id": "s"}).status_code == 200
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 3
    db = sqlite3.connect(cache_path)
    stored = dict(db.execute("SELECT api, history != '' FROM entries WHERE provenance LIKE 'simulated:%'").fetchall())
    assert stored == {"addagenda": 1, "querystock": int(rule == "recent"), "list_all_airports": int(rule == "recent")}


def test_health_reports_sessions(serve, samples, engine_down, cache_location):
    cache = open_cache(cache_location)
    import_pairs(cache, samples / "pairs.jsonl", ToolRegistry.load([samples / "tools"]))
    cache.close()
    with serve(api_base=[engine_down], engine_retries=0, **store_settings(cache_location)) as server:
        server.client.post("/virtual", json=body(*LOGIN[:4]), headers={"X-Session-Id": "a"})  # recorded: a hit
        server.virtual(body(*LOGIN[:4], session_id="b"))
        server.virtual(body(*LOGIN[:4], session_id=""))  # "" is no session
        server.client.post("/virtual", json=body(*BALANCE[:3], {"token": "nope"}), headers={"X-Session-Id": "c"})
        # Sessions hold answered calls: "c" got an engine failure only.
        assert server.client.get("/health").json()["sessions"] == {"open": 2, "history": 8, "cache_entries": 0}


def test_a_call_the_argument_policy_refuses_is_in_its_sessions_history(serve, samples, tmp_path):
    """The training data's histories hold every earlier call of an episode, a failed login included (API-Bank's
    generated episodes: 1,067 of the shipped split's session records show one); the agent got the server's refusal,
    so the next call of the session is shown it. FixedReplyEngine stands in for the simulator: only the prompt it is
    sent matters here."""
    from harness.fake_engines import FixedReplyEngine

    login_without_password = ("APIBank", "apibank_account", "GetUserToken", {"username": "JaneSmith"})
    with (
        FixedReplyEngine('{"error": "", "response": {"balance": 10}}') as engine,
        serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine.url], missing_required="reject") as server,
    ):
        refused = server.client.post("/virtual", json=body(*login_without_password), headers={"X-Session-Id": "s"})
        assert refused.json()["error"].startswith("Missing required parameter 'password'")
        assert server.client.post("/virtual", json=body(*BALANCE), headers={"X-Session-Id": "s"}).status_code == 200
    [asked] = [r for r in engine.requests if r["messages"][0]["role"] == "system"]  # not the start's reachability ping
    prompt = "\n".join(m["content"] for m in asked["messages"])
    assert "Earlier calls in this session" in prompt and "Missing required parameter 'password'" in prompt
    assert '"username":"JaneSmith"' in prompt


def test_the_training_history_shows_a_refused_call_as_the_server_s_session_does(serve, samples, tmp_path):
    """api-bank gen-00498 (real pairs): a login without its password (the real API: "GetUserToken.call() missing 1
    required positional argument"), then three calls. A server with the default policy refuses the login itself and
    its session holds that refusal; the data builder with the same policy (its default) renders the later calls'
    histories so, and every prompt the server sends equals the training record of its step. RecordedAnswerEngine
    stands in for the simulator: it answers each call as its training record teaches, so only the prompts could
    differ."""
    from harness.fake_engines import RecordedAnswerEngine

    episode = sorted(
        (p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["episode"] == "gen-00498"), key=lambda p: p["step"]
    )
    assert episode[0]["response"]["error"].startswith("GetUserToken.call() missing 1 required positional argument")
    registry = ToolRegistry.load([samples / "tools"])
    options = SimulatorDataOptions("mirrorapi-session-v2", history=8, ood_fraction=0, id_fraction=0)
    splits, _ = build_simulator_records(episode, registry, options)
    records = {r["step"]: r["prompt"] for r in splits["train"]}
    taught = {
        json.dumps(json.loads(r["arguments"]), sort_keys=True): r["completion"][0]["content"] for r in splits["train"]
    }
    with (
        RecordedAnswerEngine(taught) as engine,
        serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine.url], few_shot=0, session_history=8) as server,
    ):
        for pair in episode:
            arguments = (pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"])
            answer = server.client.post("/virtual", json=body(*arguments), headers={"X-Session-Id": "e"}).json()
            if pair["step"] == 0:
                assert answer["error"].startswith("Missing required parameter 'password' of GetUserToken")
    asked = [r["messages"] for r in engine.requests if r["messages"][0]["role"] == "system"]
    assert asked == [records[step] for step in (1, 2, 3)]  # the login never reaches the engine
    assert "Missing required parameter 'password'" in asked[0][-1]["content"]


def test_a_long_structured_answer_is_cut_in_the_history_as_its_recorded_text_would_be(serve, tmp_path):
    """`mirrorapi-v2`'s simulator answers JSON objects; one of a few KB was kept whole in the session, longer than
    the session's character budget, so the calls before it were dropped and the next call was asked as a session's
    first. The data builder renders the same answer, recorded as text, cut at the response budget: the next call
    must see it so, after the login before it. FixedReplyEngine stands in for the simulator."""
    from harness.fake_engines import FixedReplyEngine

    prices = {"prices": [{"day": day, "open": 100 + day, "close": 101 + day} for day in range(150)]}
    stock = ("APIBank", "apibank_finance", "QueryStock", {"stock_code": "NFLX", "date": "2023-03-02"})
    with (
        FixedReplyEngine(json.dumps({"error": "", "response": prices})) as engine,
        serve(
            cache_path=str(tmp_path / "c.sqlite"),
            api_base=[engine.url],
            prompt_format="mirrorapi-v2",
            session_history=4,
            session_char_budget=8192,  # two answers cut (2.6 KB each as lines) fit, two whole (5.3 KB) do not
        ) as server,
    ):
        for call in (LOGIN[:4], stock, BALANCE):
            assert server.client.post("/virtual", json=body(*call), headers={"X-Session-Id": "s"}).status_code == 200
    asked = [r for r in engine.requests if r["messages"][0]["role"] == "system"]
    prompt = asked[-1]["messages"][-1]["content"]
    recorded_text = json.dumps(prices, separators=(",", ":"))  # as a pair would hold the answer
    assert len(recorded_text) > 2048
    assert history_line("apibank_finance", "querystock", stock[3], "", recorded_text, "mirrorapi-session-v2") in prompt
    assert '"username":"JaneSmith"' in prompt  # the login before it (answered as long: the engine's one reply)


def test_arguments_over_the_size_bound_leave_the_session_as_it_was(serve, tmp_path):
    """A call refused for the server's own bound on what it simulates (`max_arguments_chars`) got no answer of the
    API; entered in the session, its line (the whole request) was longer than the session's character budget and
    pushed every earlier call out. The next call is shown the login before it, and not the refused call."""
    from harness.fake_engines import FixedReplyEngine

    huge = ("APIBank", "apibank_finance", "QueryStock", {"stock_code": "X" * 5000, "date": "2023-03-02"})
    with (
        FixedReplyEngine('{"error": "", "response": {"balance": 10}}') as engine,
        serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine.url], max_arguments_chars=2000) as server,
    ):
        for call in (LOGIN[:4], huge, BALANCE):
            answer = server.client.post("/virtual", json=body(*call), headers={"X-Session-Id": "s"}).json()
        refused = server.client.post("/virtual", json=body(*huge), headers={"X-Session-Id": "t"}).json()
    assert refused["error"].startswith("tool_input is too large to simulate") and answer["error"] == ""
    asked = [r for r in engine.requests if r["messages"][0]["role"] == "system"]
    prompt = asked[-1]["messages"][-1]["content"]
    assert '"username":"JaneSmith"' in prompt and "XXXX" not in prompt


def test_a_session_id_with_a_control_character_is_the_client_s_mistake_on_every_store(serve, cache_location):
    """PostgreSQL keeps no NUL in text (its docs, "Character Types"): a session named with one failed every call as
    an internal error there, and worked on SQLite. On both stores it is now a 422 that says why, as is an OpenEnv
    episode id with one; a printable id still names its session."""
    from harness.fake_engines import StubEngine

    with (
        StubEngine(model="stub") as engine,
        serve(api_base=[engine.url], model="stub", **store_settings(cache_location)) as server,
    ):
        refused = [
            server.client.post("/virtual", json={**body(*BALANCE), "session_id": f"episode{c}1"})
            for c in ("\x00", "\t")
        ]
        episode = server.client.post("/reset", json={"episode_id": "episode\x001"})
        kept = server.client.post("/virtual", json={**body(*BALANCE), "session_id": "episode 1 (é)"})
    for response in refused:
        assert response.status_code == 422 and "control character" in response.json()["error"]
    assert episode.status_code == 422 and "control character" in episode.json()["detail"]
    assert kept.status_code == 200 and kept.headers["x-mirrorapi-outcome"] == "simulated"


def test_a_session_id_is_checked_as_an_episode_id_is(serve):
    """One check of an id that names a session, on /virtual and on OpenEnv's reset: its length (256 and OpenEnv's
    255), a control character (above), a lone surrogate (JSON's "\\ud800", which no store can keep; /virtual's
    JSON parser refuses it first)."""
    from harness.fake_engines import StubEngine

    with StubEngine(model="stub") as engine, serve(api_base=[engine.url], model="stub") as server:
        virtual = server.client.post("/virtual", json={**body(*BALANCE), "session_id": "e" * 300})
        assert virtual.status_code == 422 and "must have 1 to 256 characters, got 300" in virtual.json()["error"]
        for episode_id, why in (("e" * 300, "must have 1 to 255 characters, got 300"), ("e\ud800", "lone surrogate")):
            sent = json.dumps({"episode_id": episode_id})  # ASCII: the surrogate as its escape
            reset = server.client.post("/reset", content=sent, headers={"content-type": "application/json"})
            assert reset.status_code == 422 and why in reset.json()["detail"], reset.text


def test_a_non_ascii_session_id_names_one_session_in_the_header_and_in_the_body(serve, tmp_path):
    """A client writes the id as UTF-8 in the header as in its JSON body: one session (the header was read as
    Latin-1, "é" as "Ã©": two sessions, each call first in its own); a Latin-1 header still reads."""
    from harness.fake_engines import StubEngine

    cache_path = tmp_path / "c.sqlite"
    with (
        StubEngine(model="stub") as engine,
        serve(api_base=[engine.url], model="stub", cache_path=str(cache_path), session_history=8) as server,
    ):
        server.client.post("/virtual", json=body(*LOGIN[:4]), headers={"X-Session-Id": "épisode".encode()})
        server.virtual({**body(*BALANCE), "session_id": "épisode"})
        server.client.post("/virtual", json=body(*BALANCE), headers={"X-Session-Id": "café".encode("latin-1")})
    sessions = {row[0]: row[2] for row in ResponseCache(cache_path).sessions()}
    assert sessions == {"épisode": 2, "café": 1}


def test_a_system_prompt_file_is_the_stateless_calls_in_the_data_as_on_the_server(samples, tmp_path):
    """The server sends `system_prompt_file` with the stateless format only, a session call with the session
    format's own; the data builder put the file's prompt into the session records too, so a model trained so was
    asked otherwise than it learnt on every session call."""
    episode = sorted(
        (p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["episode"] == "gen-00133"), key=lambda p: p["step"]
    )
    registry = ToolRegistry.load([samples / "tools"])
    custom = "You simulate APIs for the tests of this project. Answer with one JSON observation."
    (prompt_file := tmp_path / "system.txt").write_text(custom, encoding="utf-8")
    options = SimulatorDataOptions(
        SESSION_FORMAT, history=2, ood_fraction=0, id_fraction=0, system_prompt=custom, stateless_too=True
    )
    splits, _ = build_simulator_records(episode, registry, options)
    settings = load_settings(
        overrides={
            "tools_folder": [str(samples / "tools")],
            "session_history": 2,
            "system_prompt_file": str(prompt_file),
        },
        environ={},
    )
    simulator = Simulator(engine=None, settings=settings)
    session = Session(keep=settings.session_history)
    served = {}
    for pair in episode:
        doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        served[(pair["step"], True)] = simulator.messages(doc, pair["tool_input"], session.history(2, 4096))
        served[(pair["step"], False)] = simulator.messages(doc, pair["tool_input"], None)
        session.record(doc.tool, doc.api, pair["tool_input"], **pair["response"], fmt=SESSION_FORMAT)
    records = splits["train"]
    assert {r["prompt"][0]["content"] == custom for r in records} == {True, False}  # both kinds are there
    for record in records:
        in_session = record["prompt_format"] == SESSION_FORMAT
        assert record["prompt"] == served[(record["step"], in_session)], (record["step"], record["prompt_format"])


def test_a_call_whose_client_gave_up_enters_its_session_once_when_asked_again(serve, tmp_path):
    """A client that stops waiting (its timeout, on a slow CPU engine) never saw the answer; the server finished the
    simulation and put the call in the session all the same, and the client's retry put it there again. Now the
    call waits for the retry, which the cache answers the same (the same call after the same history)."""
    import time

    import httpx

    from harness.fake_engines import FixedReplyEngine
    from harness.processes import poll_until

    class SlowBalance(FixedReplyEngine):  # the balance call takes 1.5 s: the client below waits 0.3 s
        def chat(self, request):
            if "querybalance" in request["messages"][-1]["content"].rsplit("API documentation", 1)[-1].lower():
                time.sleep(1.5)
            return super().chat(request)

    stock = ("APIBank", "apibank_finance", "QueryStock", {"stock_code": "NFLX", "date": "2023-03-02"})
    with (
        SlowBalance('{"error": "", "response": {"balance": 10}}') as engine,
        serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine.url]) as server,
    ):
        session = {"X-Session-Id": "s"}
        assert server.client.post("/virtual", json=body(*LOGIN[:4]), headers=session).status_code == 200
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/virtual", json=body(*BALANCE), headers=session, timeout=0.3)
        # the server has finished that call: counted in /metrics once its answer was made, the client gone
        poll_until(
            lambda: True if server.metric("mirrorapi_requests_total", outcome="simulated") >= 2 else None,
            timeout=30,
            what="the server finishing the balance call its client gave up on",
            interval=0.05,
        )
        retried = server.client.post("/virtual", json=body(*BALANCE), headers=session)
        assert retried.status_code == 200 and retried.headers["x-mirrorapi-outcome"] == "hit"
        assert server.client.post("/virtual", json=body(*stock), headers=session).status_code == 200
    prompt = [r for r in engine.requests if r["messages"][0]["role"] == "system"][-1]["messages"][-1]["content"]
    assert prompt.count('"api":"querybalance"') == 1 and '"username":"JaneSmith"' in prompt
