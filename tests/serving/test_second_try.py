"""An answer cut at `max_tokens` is asked once more, sampled (`second_try_temperature`), and the second answer kept
when it ends before the limit: a greedy small simulator's loop is neither the API's answer nor JSON.

The engine is `LoopingEngine` (a stand-in: a real model loops on some calls only, never on one chosen beforehand),
served over real HTTP to a real server; the finish reason the rule reads is checked on a real `transformers serve`
in tests/test_engine_client.py."""

import contextlib
import json

import pytest

from harness.fake_engines import LoopingEngine
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.simulator import SECOND_TRY_SEED, simulator_identity

SAMPLED = {"error": "", "response": {"reservations": ["NZX999", "HATHAT"]}}
CALL = ("TauBench", "taubench_airline", "get_user_details", {"user_id": "mia_li_3668"})


def simulations(engine: LoopingEngine) -> list[dict]:
    """The requests of the simulator's calls (not the server's one-token probe of the engine)."""
    return [body for body in engine.requests if body["max_tokens"] == 64]


@contextlib.contextmanager
def server_on(serve, engine: LoopingEngine, tmp_path, **settings):
    """A real server asking `engine`, with at most 64 tokens an answer, its cache and request log in `tmp_path`."""
    store = {"cache_path": str(tmp_path / "c.sqlite"), "log_file": str(tmp_path / "requests.jsonl")}
    with serve(api_base=[engine.url], model="m", max_tokens=64, **store, **settings) as server:
        yield server


def requests_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_cut_answer_is_asked_again_sampled_and_the_whole_second_answer_kept(serve, agent, tmp_path):
    with (
        LoopingEngine(SAMPLED) as engine,
        server_on(serve, engine, tmp_path) as server,
    ):
        body = agent(*CALL)
        first = server.virtual(body)
        assert first.status_code == 200 and first.json() == SAMPLED
        # The first ask is the server's greedy one; the second sampled, seeded so that the call's answer is
        # the same on every server, and held to the same limit.
        greedy, sampled = simulations(engine)
        assert (greedy["temperature"], "seed" in greedy) == (0.0, False)
        assert (sampled["temperature"], sampled["seed"], sampled["max_tokens"]) == (0.7, SECOND_TRY_SEED, 64)
        assert sampled["messages"] == greedy["messages"]
        assert sampled["response_format"] == greedy["response_format"]
        assert server.metric("mirrorapi_second_tries_total", result="kept") == 1

        again = server.virtual(body)  # the kept answer was stored: a hit, no engine call
        assert again.content == first.content and len(simulations(engine)) == 2

    simulated = next(line for line in requests_log(tmp_path / "requests.jsonl") if line["outcome"] == "simulated")
    assert (simulated["second_try"], simulated["parsed"]) == ("kept", "json")
    assert "second_try=0.7" in simulated["provenance"]


def test_a_second_answer_cut_again_leaves_the_first(serve, agent, tmp_path):
    with (
        LoopingEngine(SAMPLED, when_sampled="loop") as engine,
        server_on(serve, engine, tmp_path) as server,
    ):
        answer = server.virtual(agent(*CALL))
        assert answer.status_code == 200
        observation = answer.json()
        # The greedy loop, closed by the server's repair: the list of the looped item, no third ask.
        assert observation["error"] == "" and set(observation["response"]["reservations"]) == {"NZX999"}
        assert len(simulations(engine)) == 2
        assert server.metric("mirrorapi_second_tries_total", result="cut again") == 1
    (line,) = requests_log(tmp_path / "requests.jsonl")
    assert (line["second_try"], line["parsed"]) == ("cut again", "repaired")


def test_a_second_try_the_engine_fails_leaves_the_first(serve, agent, tmp_path):
    with (
        LoopingEngine(SAMPLED, when_sampled="fail") as engine,
        server_on(serve, engine, tmp_path, engine_retries=0) as server,
    ):
        answer = server.virtual(agent(*CALL))
        assert answer.status_code == 200 and answer.headers["x-mirrorapi-outcome"] == "simulated"
        assert set(answer.json()["response"]["reservations"]) == {"NZX999"}
        assert server.metric("mirrorapi_second_tries_total", result="failed") == 1


def test_without_second_tries_a_cut_answer_is_served_as_the_engine_cut_it(serve, agent, tmp_path):
    with (
        LoopingEngine(SAMPLED) as engine,
        server_on(serve, engine, tmp_path, second_try_temperature=0) as server,
    ):
        observation = server.virtual(agent(*CALL)).json()
        assert set(observation["response"]["reservations"]) == {"NZX999"}
        assert len(simulations(engine)) == 1
        assert server.metric("mirrorapi_second_tries_total", result="kept") == 0


@pytest.mark.parametrize(
    "settings, second_try",
    [
        ({}, 0.7),
        ({"second_try_temperature": 0}, 0.0),
        ({"prompt_format": "stabletoolbench", "system_prompt_file": "SYSTEM"}, 0.0),  # upstream asks once
        ({"prompt_format": "stabletoolbench", "system_prompt_file": "SYSTEM", "second_try_temperature": 0.5}, 0.5),
    ],
    ids=["default", "off", "stabletoolbench", "stabletoolbench-set"],
)
def test_the_setting_and_the_identity_it_names(settings, second_try, tmp_path):
    if "system_prompt_file" in settings:
        (tmp_path / "SYSTEM").write_text("You are an API.", encoding="utf-8")
        settings = {**settings, "system_prompt_file": tmp_path / "SYSTEM"}
    resolved = ServerSettings(tools_folder=[tmp_path], **settings)
    assert resolved.second_try_temperature == second_try
    # Answers of a server that asks a cut answer again are another simulator's than those of one that does not.
    identity = simulator_identity(resolved)
    assert [part for part in identity.split(",") if part.startswith("second_try=")] == (
        [f"second_try={second_try:g}"] if second_try else []
    )


def test_both_tries_share_the_engine_timeout():
    """The second try gets what the first left of `engine_timeout`: given each its own, a slow engine's call ran
    past its lease (`engine_timeout` + a margin) and another worker simulated the same call again."""
    import asyncio
    import time

    from mirrorapi.engine_client import EngineClient
    from mirrorapi.serving.simulator import ask_engine

    class SlowLoopingEngine(LoopingEngine):  # a stand-in: each answer takes 0.6 s
        def chat(self, request: dict):
            time.sleep(0.6)
            return super().chat(request)

    async def ask(url: str):
        engine = EngineClient([url], "m", timeout=1.0, retries=0)
        try:
            start = time.monotonic()
            (_, _, finish), second_try = await ask_engine(
                engine,
                [{"role": "user", "content": "x"}],
                None,
                temperature=0.0,
                max_tokens=8,
                seed=None,
                second_try_temperature=0.7,
            )
            return finish, second_try, time.monotonic() - start
        finally:
            await engine.aclose()

    with SlowLoopingEngine(SAMPLED) as engine:
        finish, second_try, took = asyncio.run(ask(engine.url))
    assert (finish, second_try) == ("length", "failed")  # the first answer, served when the time ran out
    # The deadline kept: not waiting out the second answer (0.6 s more) to drop it. A timing that is the behaviour:
    # the file is in tests/conftest.py's TIMES_ITSELF.
    assert took < 1.15
