"""Cache misses against engines: a real `transformers serve` of an untrained tiny model (its output is
garbage), an engine that hangs (fake: cannot be provoked with a real one), and replay mode."""

import concurrent.futures
import json
import threading
import time

import pytest

from harness.fake_engines import STUB_OBSERVATION, StubEngine
from harness.processes import poll_until
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache

README_REQUEST = {
    "category": "Artificial_Intelligence_Machine_Learning",
    "tool_name": "TTSKraken",
    "api_name": "List Languages",
    "tool_input": "{}",
    "strip": "truncate",
    "toolbench_key": "",
}
# The untrained tiny model's greedy answer, streamed as the server asks for it, is 12 newlines (`transformers serve`
# answers the same request unstreamed with no text at all): the agent is told exactly what it was, not a vague
# failure.
GARBAGE = {
    "error": "Failed to generate fake response (the simulator's output was not JSON (12 characters))",
    "response": "",
}


@pytest.fixture(scope="module")
def garbage(serve, tiny_engine, tmp_path_factory):
    with serve(
        api_base=[tiny_engine.base_url],
        model=tiny_engine.model,
        max_tokens=12,
        cache_path=str(tmp_path_factory.mktemp("db") / "c.sqlite"),
    ) as server:
        yield server


@pytest.mark.slow
def test_readme_request_with_a_garbage_engine_is_an_error_never_cached(garbage):
    calls = garbage.metric("mirrorapi_engine_calls_total", result="garbage")
    for _ in range(2):
        response = garbage.virtual(README_REQUEST)
        assert (response.status_code, response.json()) == (200, GARBAGE)
    assert garbage.metric("mirrorapi_engine_calls_total", result="garbage") == calls + 2  # asked again
    health = garbage.client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["cache"]["entries"] == 0
    # Behaviour, not which probe answered: depending on its version, `transformers serve` lists the model at
    # /v1/models or only answers a completion for it; either way /health must say it serves this model.
    assert health.json()["engine"][0]["serves_model"] is True


@pytest.mark.slow
def test_identical_concurrent_misses_make_one_engine_call(garbage):
    body = {**README_REQUEST, "tool_input": '{"concurrent": true}'}
    calls = garbage.metric("mirrorapi_engine_calls_total", result="garbage")
    coalesced = garbage.metric("mirrorapi_coalesced_requests_total")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: garbage.virtual(body).json(), range(8)))
    assert answers == [GARBAGE] * 8
    assert garbage.metric("mirrorapi_engine_calls_total", result="garbage") == calls + 1
    assert garbage.metric("mirrorapi_coalesced_requests_total") == coalesced + 7


@pytest.mark.slow
def test_metrics_count_outcomes_and_stage_latency(garbage):
    garbage.virtual(README_REQUEST)
    text = garbage.client.get("/metrics").text
    assert 'mirrorapi_requests_total{outcome="engine_error"}' in text
    assert 'mirrorapi_cache_lookups_total{result="miss"}' in text
    for stage in ("parse", "resolve", "cache_lookup", "engine", "total"):
        assert f'mirrorapi_stage_seconds_count{{stage="{stage}"}}' in text


def test_hanging_engine_is_an_error_within_the_timeout(serve, engine_hanging, tmp_path):
    with serve(
        api_base=[engine_hanging], engine_timeout=1.5, engine_retries=1, cache_path=str(tmp_path / "c.sqlite")
    ) as server:
        start = time.monotonic()
        response = server.virtual(README_REQUEST)
        elapsed = time.monotonic() - start
        assert response.json() == {
            "error": "Failed to generate fake response (the simulator engine did not answer in time)",
            "response": "",
        }
        assert 1.4 < elapsed < 3.0
    assert ResponseCache(tmp_path / "c.sqlite").count() == 0


def test_replay_mode_answers_from_the_cache_only(serve, engine_hanging, tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    cache.put(
        "Data",
        "theclique",
        "transfermarkt_search",
        canonical_json({"name": "Lionel Messi"}),
        "",
        "[{'name': 'Lionel Messi'}]",
        "real",
    )
    cache.close()
    # The engine hangs: a replay server that asked it would not answer within the test's patience.
    with serve(
        api_base=[engine_hanging], mode="replay", engine_timeout=30, cache_path=str(tmp_path / "c.sqlite")
    ) as server:
        body = {
            "category": "Data",
            "tool_name": "theclique",
            "api_name": "transfermarkt_search",
            "tool_input": '{"name": "Lionel Messi"}',
        }
        assert server.virtual(body).json() == {"error": "", "response": "[{'name': 'Lionel Messi'}]"}
        start = time.monotonic()
        miss = server.virtual({**body, "tool_input": '{"name": "Pele"}'}).json()
        assert time.monotonic() - start < 2
        assert miss == {
            "error": "No recorded response for this call (the server replays its cache only).",
            "response": "",
        }
        assert server.metric("mirrorapi_requests_total", outcome="replay_miss") == 1
        health = server.client.get("/health").json()
        assert health["mode"] == "replay" and health["engine"] == [] and health["status"] == "ok"
    assert ResponseCache(tmp_path / "c.sqlite").stats()["hits"] == 1  # flushed at shutdown


@pytest.mark.slow
def test_a_model_the_engine_does_not_serve_is_reported_at_start_up_and_by_health(serve, tiny_engine, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="mirrorapi.serving"):
        with serve(
            api_base=[tiny_engine.base_url], model="mirrorapi", cache_path=str(tmp_path / "c.sqlite")
        ) as server:
            response = server.client.get("/health")
            deadline = time.monotonic() + 10
            while "does not serve" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
    assert response.status_code == 503 and response.json()["status"] == "unavailable"
    replica = response.json()["engine"][0]
    assert replica["reachable"] is True and replica["serves_model"] is False
    assert replica["detail"].startswith("does not serve model 'mirrorapi'")
    assert "one-token completion failed" in replica["detail"]  # the engine was asked, and refused
    lines = [r.getMessage() for r in caplog.records if "does not serve model" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and lines[0].startswith(f"engine {tiny_engine.base_url} ")


def test_an_api_base_without_v1_is_reported_at_start_up(serve, engine_down, tmp_path, caplog):
    base = engine_down.removesuffix("/v1")
    with caplog.at_level("WARNING", logger="mirrorapi.serving"):
        with serve(api_base=[base, engine_down], cache_path=str(tmp_path / "c.sqlite")):
            pass
    lines = [r.getMessage() for r in caplog.records if "does not end in /v1" in r.getMessage()]
    assert lines == [
        f"api_base {base} does not end in /v1: OpenAI-compatible engines (vllm serve, transformers "
        f"serve) answer at {base}/v1/chat/completions"
    ]


def test_without_an_attempt_timeout_a_hung_replica_leaves_time_for_the_other(serve, engine_stub, tmp_path, caplog):
    """Issue 21 §2: two replicas, one hung, engine_timeout 2 and no engine_attempt_timeout: the attempt timeout is
    derived (1 s: the deadline shared by the two replicas), so a call that meets the hung one fails over to the
    other in time. (With the whole deadline per attempt, such a call failed.)"""
    from harness.fake_engines import HungEngine

    with (
        HungEngine() as hung,
        caplog.at_level("INFO", logger="mirrorapi.serving"),
        serve(
            api_base=[hung.url, engine_stub()],
            engine_timeout=2.0,
            engine_cooldown=60,
            cache_path=str(tmp_path / "c.sqlite"),
        ) as server,
    ):
        answers = [server.virtual({**README_REQUEST, "tool_input": f'{{"call": {i}}}'}).json() for i in range(3)]
        assert hung.connections >= 1  # the hung replica was met
    assert all(answer["error"] == "" for answer in answers), answers
    assert (
        "an attempt 1 s before the next replica is tried (engine_attempt_timeout unset: engine_timeout 2 s "
        "shared by the 2 replicas a call can try)" in caplog.text
    )


def test_a_miss_beyond_the_simulators_queue_is_told_it_is_busy(serve, tmp_path):
    """Issue 21 §2: one call in flight per replica and none waiting: the misses sent together with the one that
    takes the replica (its answer takes 2 s) are answered at once that the simulator is busy."""
    from harness.fake_engines import StubEngine

    busy = {
        "error": "Failed to generate fake response (the simulator is busy: too many calls are waiting for it; "
        "try again later)",
        "response": "",
    }
    with (
        StubEngine(delay=2.0) as engine,
        serve(
            api_base=[engine.url], engine_max_in_flight=1, engine_max_waiting=0, cache_path=str(tmp_path / "c.sqlite")
        ) as server,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        answers = list(
            pool.map(lambda i: server.virtual({**README_REQUEST, "tool_input": f'{{"call": {i}}}'}).json(), range(4))
        )
    simulated = [a for a in answers if a["error"] == ""]
    assert len(simulated) >= 1 and busy in answers
    assert all(a == busy for a in answers if a["error"]), answers


def test_health_says_busy_not_down_while_a_llama_cpp_like_engine_answers_a_long_call(serve, tmp_path):
    # llama.cpp's server (llama-cpp-python) answers GET /v1/models only between completions, under the lock its
    # generation holds: a stand-in that does the same (a real CPU engine's long call cannot be had on demand).
    import asyncio

    from fastapi import FastAPI

    from harness.processes import free_port, serve_in_thread

    engine = FastAPI()
    lock = asyncio.Lock()
    generating = threading.Event()  # set once the engine holds its lock for the call below (not a start-up probe)

    @engine.get("/v1/models")
    async def models() -> dict:
        async with lock:
            return {"object": "list", "data": [{"id": "simulator", "object": "model", "owned_by": "llama-cpp"}]}

    @engine.post("/v1/chat/completions")
    async def chat(request: dict) -> dict:
        async with lock:
            if "Messi" in json.dumps(request):
                generating.set()
            await asyncio.sleep(3)  # past /health's 2 s look at the engine, asked once this holds the lock
            message = {"role": "assistant", "content": '{"error": "", "response": "ok"}'}
            return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {}}

    body = {
        "category": "Data",
        "tool_name": "theclique",
        "api_name": "transfermarkt_search",
        "tool_input": '{"name": "Messi"}',
    }
    with (
        serve_in_thread(engine, free_port(), access_log=False) as engine_url,
        serve(api_base=[engine_url + "/v1"], model="simulator", cache_path=str(tmp_path / "c.sqlite")) as server,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert server.client.get("/health").status_code == 200  # idle: it lists the model
        call = pool.submit(server.client.post, "/virtual", json=body, timeout=30)
        poll_until(lambda: generating.is_set() or None, 10, "the call's completion at the engine", interval=0.02)
        busy = server.client.get("/health")
        assert call.result().json() == {"error": "", "response": "ok"}
    assert busy.status_code == 200 and busy.json()["status"] == "ok", busy.text
    assert "busy" in busy.json()["engine"][0]["detail"]


def test_health_does_not_ask_an_engine_that_just_answered_a_call(serve, tmp_path):
    """An engine whose model list does not name the model (`transformers serve`'s) is asked for a one-token
    completion at start-up; once it has answered one of the server's calls, a health poller's GET /health takes that
    answer as the proof, instead of adding a completion of its own beside the calls the in-flight limit allows."""
    with (
        StubEngine() as engine,
        serve(api_base=[engine.url], model="stub", cache_path=str(tmp_path / "c.sqlite")) as server,
    ):
        poll_until(lambda: engine.requests == 1 or None, 10, "no start-up check reached the engine")
        assert server.virtual(README_REQUEST).json()["response"] == STUB_OBSERVATION["response"]
        for _ in range(3):
            health = server.client.get("/health")
            assert health.status_code == 200 and health.json()["engine"][0]["serves_model"] is True
        assert engine.requests == 2  # the start-up check and the call, no more
