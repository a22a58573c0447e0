"""The event loop never waits on SQLite's write lock, no answered write is dropped, and shutdown
stores the simulations still in flight before closing the cache."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

import httpx
import pytest

from harness.fake_engines import STUB_OBSERVATION, FixedReplyEngine
from harness.processes import poll_until
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import Call, ResponseCache, new_entry
from mirrorapi.serving.cache.entries import CacheError
from mirrorapi.serving.cache.sqlite_writer import LoopWriter

API = ("Data", "theclique", "transfermarkt_search")
LOCK_SECONDS = 1.5


def hold_write_lock(path, seconds: float, held: threading.Event, releasing: threading.Event) -> None:
    """Another process's long write transaction (an import), on a connection of its own. `releasing` is set just
    before its commit lets the lock go: a write that commits was committed after it was set."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    held.set()
    time.sleep(seconds)
    releasing.set()
    db.execute("COMMIT")
    db.close()


def test_writes_wait_for_the_lock_without_blocking_the_event_loop_and_none_is_dropped(tmp_path):
    path = tmp_path / "c.sqlite"
    # Shorter than the lock: the writes must retry, not drop. Twice the longest loop turn allowed below: a writer
    # connection that waited on SQLite's lock (its busy timeout) would stop the loop that long.
    cache = ResponseCache(path, busy_timeout=1.0)
    cache.put(*API, {"name": "recorded"}, "", "recorded", "real")
    held, releasing = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(path, LOCK_SECONDS, held, releasing))
    stored_once_released: list[bool] = []  # for each store, whether the lock was being let go when it was answered

    async def scenario():
        holder.start()
        await asyncio.to_thread(held.wait)
        stores = [
            asyncio.ensure_future(
                cache.store(new_entry(*API, {"i": i, "z": 0}, "", f"answer {i}", "simulated:m", time.time()))
            )
            for i in range(20)
        ]
        for store in stores:
            store.add_done_callback(lambda _: stored_once_released.append(releasing.is_set()))
        assert await cache.lookup(Call(*API, canonical_json({"name": "recorded"})), "m")  # a hit while it is held
        assert not releasing.is_set()
        maintained = asyncio.ensure_future(cache.maintain(idle_seconds=3600))  # the hit count waits too
        longest = 0.0
        while not all(s.done() for s in stores):  # the loop keeps turning while the writes wait
            tick = time.perf_counter()
            await asyncio.sleep(0.01)
            longest = max(longest, time.perf_counter() - tick)
        await maintained
        results = await asyncio.gather(*stores)
        await cache.aclose()
        return results, longest

    results, longest_turn = asyncio.run(scenario())
    holder.join()
    assert results == [True] * 20
    assert stored_once_released == [True] * 20  # they did wait for the lock...
    # ...and the loop did not: the timing is the behaviour (the file is in tests/conftest.py's TIMES_ITSELF)
    assert longest_turn < 0.5
    cache = ResponseCache(path)
    assert all(cache.get(*API, canonical_json({"i": i, "z": 0}), "m") for i in range(20))
    assert cache.stats()["hits"] == 1  # the hit counted while the lock was held


def test_a_job_that_raises_fails_alone_and_the_next_write_commits(tmp_path):
    # Any exception of a job (here a ValueError, as an encoding error once was), not only SQLite's: its own writes
    # are undone and its caller told; the other requests' writes of the same loop turn commit (they once failed
    # with it: one answer that could not be encoded lost every answer, session step and lease of its turn), and
    # the connection is left out of any transaction.
    db = sqlite3.connect(tmp_path / "w.sqlite", isolation_level=None)
    db.execute("CREATE TABLE t (v TEXT)")

    def bad(connection):
        connection.execute("INSERT INTO t VALUES ('rolled back')")
        raise ValueError("not storable")

    async def scenario():
        writer = LoopWriter(db)
        failed = writer.submit(bad), writer.submit(lambda c: c.execute("INSERT INTO t VALUES ('same batch')"))
        outcomes = await asyncio.wait_for(asyncio.gather(*failed, return_exceptions=True), 5)
        stored = await asyncio.wait_for(writer.submit(lambda c: c.execute("INSERT INTO t VALUES ('later')")), 5)
        return outcomes, stored

    outcomes, _ = asyncio.run(scenario())
    assert isinstance(outcomes[0], CacheError) and "not storable" in str(outcomes[0])
    assert isinstance(outcomes[1], sqlite3.Cursor)  # the job's own result
    assert db.execute("SELECT v FROM t").fetchall() == [("same batch",), ("later",)]


def test_shutdown_stores_simulations_still_in_flight(serve, engine_stub, tmp_path):
    body = {
        "category": "Data",
        "tool_name": "theclique",
        "api_name": "transfermarkt_search",
        "tool_input": '{"name": "Lionel Messi"}',
    }
    # The engine answers after the client gave up and after uvicorn's graceful shutdown cancelled the request.
    with (
        serve(
            api_base=[engine_stub(delay=1.5)], cache_path=str(tmp_path / "c.sqlite"), graceful_shutdown=0.2
        ) as server,
        pytest.raises(httpx.ReadTimeout),
    ):
        server.client.post("/virtual", json=body, timeout=0.5)
    cache = ResponseCache(tmp_path / "c.sqlite")
    ((_, _, _, _, observation, provenance),) = cache.entries()
    assert json.loads(observation) == STUB_OBSERVATION and provenance.startswith("simulated:")


def test_a_request_still_running_when_the_stop_is_over_gets_an_answer_in_the_apis_shape(serve, tmp_path):
    """uvicorn cancels what still runs when its graceful stop is over; the client got uvicorn's plain-text 500,
    uncounted and unlogged. It gets a 503 in the `{"error", "response"}` shape, and its answer is stored for the
    retry (the engine answers after the stop)."""
    import concurrent.futures

    body = {
        "category": "Data",
        "tool_name": "theclique",
        "api_name": "transfermarkt_search",
        "tool_input": '{"name": "Kaka"}',
    }
    log = tmp_path / "requests.jsonl"

    class SlowEngine(FixedReplyEngine):  # answers 1.5 s after it is asked: after the stop
        def chat(self, request):
            time.sleep(1.5)
            return super().chat(request)

    def the_miss_is_with_the_engine() -> bool | None:  # its prompt names Kaka (the start-up probe's does not)
        return True if any("Kaka" in json.dumps(request) for request in engine.requests) else None

    with concurrent.futures.ThreadPoolExecutor(1) as pool, SlowEngine(json.dumps(STUB_OBSERVATION)) as engine:
        with serve(
            api_base=[engine.url],
            cache_path=str(tmp_path / "c.sqlite"),
            log_file=str(log),
            graceful_shutdown=0.3,
        ) as server:
            pending = pool.submit(httpx.post, server.url + "/virtual", json=body, timeout=10)
            # the stop begins once the miss is with the engine
            poll_until(the_miss_is_with_the_engine, timeout=10, what="the miss at the engine", interval=0.02)
        answered = pending.result()
    assert answered.status_code == 503 and answered.headers["content-type"] == "application/json"
    assert answered.json()["response"] == "" and "shutting down" in answered.json()["error"]
    assert [json.loads(line)["outcome"] for line in log.read_text().splitlines()] == ["shutting_down"]
    ((_, _, _, _, observation, _),) = ResponseCache(tmp_path / "c.sqlite").entries()
    assert json.loads(observation) == STUB_OBSERVATION
