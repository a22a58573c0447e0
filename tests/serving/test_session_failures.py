"""`session_failure_rule: related`: a simulated failure in a session stands only where an earlier call the prompt
showed is related to the call; after unrelated calls only, the call gets its answer alone (the stateless call).
`session_failure_rule: alone`: a simulated failure in a session stands only where the call alone fails too.

The engine is `SessionFailingEngine` (a stand-in: a real model answers a failure by chance, never to a call chosen
beforehand): a failure to every prompt that shows earlier session calls, a success to every call asked alone. The
server, its cache and its request log are real (uvicorn on 127.0.0.1, SQLite)."""

import contextlib
import json

from harness.fake_engines import SessionFailingEngine
from mirrorapi.serving.cache import import_pairs, open_cache
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.simulator import simulator_identity
from mirrorapi.tools import ToolRegistry

from .conftest import SAMPLE_TOOLS

FAILURE = {"error": "The username does not exist.", "response": ""}
ALONE = {"error": "", "response": {"token": "a9s8d7f6g5h4j3k2l1"}}
# Two API-Bank calls of data/samples/tools that share no argument value: a stock price, then a login.
STOCK = ("APIBank", "apibank_finance", "QueryStock", {"stock_code": "NVDA", "date": "2023-03-02"})
LOGIN = ("APIBank", "apibank_account", "GetUserToken", {"username": "JaneSmith", "password": "password"})
# A call with the token the login answered: related to it.
MODIFY = (
    "APIBank",
    "apibank_account",
    "ModifyPassword",
    {"token": ALONE["response"]["token"], "old_password": "password", "new_password": "s3cret!"},
)
SETTINGS = {"model": "m", "prompt_format": "mirrorapi-v2", "few_shot": 0, "session_history": 8}


def body(category: str, tool: str, api: str, arguments: dict, session: str) -> dict:
    return {"category": category, "tool_name": tool, "api_name": api, "tool_input": json.dumps(arguments)} | {
        "session_id": session
    }


def record(tmp_path, call: tuple, observation: dict) -> None:
    """`observation` stored as the real answer of `call` in the cache at tmp_path/c.sqlite (an imported pair)."""
    names = dict(zip(("category", "tool_name", "api_name", "tool_input"), call, strict=True))
    pair = {"source": "api-bank-generated", "episode": "e", "step": 0, **names, "response": observation}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(pair) + "\n", encoding="utf-8")
    cache = open_cache(tmp_path / "c.sqlite")
    import_pairs(cache, tmp_path / "pairs.jsonl", ToolRegistry.load([SAMPLE_TOOLS]))
    cache.close()


@contextlib.contextmanager
def server_on(serve, tmp_path, alone: dict | None = ALONE, **settings):
    """A server asking a SessionFailingEngine, with its cache and request log in `tmp_path`."""
    store = {"cache_path": str(tmp_path / "c.sqlite"), "log_file": str(tmp_path / "requests.jsonl")}
    with (
        SessionFailingEngine(FAILURE, alone) as engine,
        serve(api_base=[engine.url], **SETTINGS, **store, **settings) as server,
    ):
        yield server, engine


def log_lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text(encoding="utf-8").splitlines()]


def asked(engine: SessionFailingEngine) -> list[bool]:
    """For each simulation the engine was asked (not the server's probe), whether it was shown session calls."""
    return [
        any(engine.SESSION_MARK in str(m["content"]) for m in request["messages"])
        for request in engine.requests
        if request.get("max_tokens", 0) > 1
    ]


def identities(**settings) -> tuple[str, str]:
    resolved = ServerSettings(tools_folder=[SAMPLE_TOOLS], **SETTINGS, **settings)
    return simulator_identity(resolved), simulator_identity(resolved, in_session=True)


def test_a_failure_after_unrelated_calls_only_is_the_call_s_answer_alone(serve, tmp_path):
    alone_identity, _ = identities(session_failure_rule="related")
    with server_on(serve, tmp_path, session_failure_rule="related") as (server, engine):
        first = server.virtual(body(*STOCK, session="episode-1"))  # a session's first call is asked alone
        login = server.virtual(body(*LOGIN, session="episode-1"))
        assert (first.json(), login.json()) == (ALONE, ALONE)
        # The login was asked in its session (a failure: nothing shown bears on it), then alone.
        assert asked(engine) == [False, True, False]

        # The session goes on from the answer given: a related call now shows the token, and its failure stands.
        modify = server.virtual(body(*MODIFY, session="episode-1"))
        assert modify.json() == FAILURE
        assert asked(engine) == [False, True, False, True]

        # The same episode again, in another session: every answer from the cache, the same as before.
        again = [server.virtual(body(*call, session="episode-2")).json() for call in (STOCK, LOGIN, MODIFY)]
        assert again == [ALONE, ALONE, FAILURE] and len(asked(engine)) == 4

    lines = [line for line in log_lines(tmp_path) if line["api"].endswith(("getusertoken", "modifypassword"))]
    login_line, modify_line = lines[0], lines[1]
    assert login_line["asked_alone"] is True and login_line["provenance"] == "simulated:" + alone_identity
    assert "asked_alone" not in modify_line and "history=8" in modify_line["provenance"]
    assert [line.get("asked_alone") for line in lines[2:]] == [True, None]


def test_the_failure_stands_under_the_default_rule(serve, tmp_path):
    assert ServerSettings.model_fields["session_failure_rule"].default == "any"
    with server_on(serve, tmp_path) as (server, engine):
        server.virtual(body(*STOCK, session="s"))
        assert server.virtual(body(*LOGIN, session="s")).json() == FAILURE
        assert asked(engine) == [False, True]
    assert all("asked_alone" not in line for line in log_lines(tmp_path))


def test_a_recorded_failure_is_what_the_api_said_and_stands(serve, tmp_path):
    recorded = {"error": "The username does not exist.", "response": ""}
    record(tmp_path, LOGIN, recorded)
    with server_on(serve, tmp_path, session_failure_rule="related") as (server, engine):
        server.virtual(body(*STOCK, session="s"))
        login = server.virtual(body(*LOGIN, session="s"))
        assert login.json() == recorded and asked(engine) == [False]
    assert log_lines(tmp_path)[-1]["provenance"] == "real" and "asked_alone" not in log_lines(tmp_path)[-1]


def test_the_session_s_failure_stays_when_the_call_alone_cannot_be_answered(serve, tmp_path):
    record(tmp_path, STOCK, {"error": "", "response": "601.2"})  # the first call: a hit, so the session has a call
    with server_on(serve, tmp_path, alone=None, session_failure_rule="related", engine_retries=0) as (server, engine):
        server.virtual(body(*STOCK, session="s"))
        login = server.virtual(body(*LOGIN, session="s"))
        assert login.status_code == 200 and login.json() == FAILURE  # the engine failed the call alone
        assert asked(engine) == [True, False]
    assert "asked_alone" not in log_lines(tmp_path)[-1]


def test_under_the_alone_rule_a_failure_after_a_related_call_is_checked_too(serve, tmp_path):
    alone_identity, _ = identities(session_failure_rule="alone")
    with server_on(serve, tmp_path, session_failure_rule="alone") as (server, engine):
        server.virtual(body(*STOCK, session="s"))
        assert server.virtual(body(*LOGIN, session="s")).json() == ALONE
        # Shown the token it needs (a related call, where `related` lets the failure stand), but alone it succeeds.
        assert server.virtual(body(*MODIFY, session="s")).json() == ALONE
        assert asked(engine) == [False, True, False, True, False]
    lines = log_lines(tmp_path)
    assert [line.get("asked_alone") for line in lines] == [None, True, True]
    assert lines[-1]["provenance"] == "simulated:" + alone_identity


def test_under_the_alone_rule_a_failure_the_call_alone_gives_too_stands_in_the_session_s_words(serve, tmp_path):
    failure_alone = {"error": "The token is incorrect.", "response": ""}
    with server_on(serve, tmp_path, alone=failure_alone, session_failure_rule="alone") as (server, engine):
        assert server.virtual(body(*STOCK, session="s")).json() == failure_alone  # a first call is asked alone
        assert server.virtual(body(*LOGIN, session="s")).json() == FAILURE
        assert asked(engine) == [False, True, False]
    last = log_lines(tmp_path)[-1]
    assert "asked_alone" not in last and "history=8" in last["provenance"]
