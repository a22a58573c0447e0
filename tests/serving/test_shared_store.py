"""Server processes sharing one cache store (issue 21 §4, §5), as real processes on 127.0.0.1 ports:

- two servers on one PostgreSQL database: a miss stored by one is a hit in the other; an identical miss
  arriving at both at once is simulated once; `kill -9` of one loses no answer it gave;
- sessions live in the store (SQLite and PostgreSQL): a server killed and started again continues them;
  one idle longer than `session_ttl` starts over and is deleted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from harness.fake_engines import STUB_OBSERVATION, StubEngine
from harness.postgres_server import temporary_postgres
from harness.processes import free_port, poll_until, stop, wait_until_ready
from mirrorapi.serving.cache import open_cache
from mirrorapi.serving.sessions import advance

from .conftest import REPO, SAMPLE_TOOLS, store_settings

API = {
    "category": "Data",
    "tool_name": "theclique",
    "api_name": "transfermarkt_search",
    "strip": "truncate",
    "toolbench_key": "",
}


def call(name: str) -> dict:
    return {**API, "tool_input": json.dumps({"name": name})}


@contextlib.contextmanager
def server_process(location: str, engine_url: str, log: Path, **settings) -> Iterator[tuple[str, subprocess.Popen]]:
    """`serving/main_mirrorapi.py` on a free port with the cache at `location`; (its URL, the process)."""
    port = free_port()
    options = {
        **store_settings(location),
        "tools_folder": str(SAMPLE_TOOLS),
        "port": port,
        "api_base": engine_url,
        "model": "stub",
        "log_level": "warning",
        **settings,
    }
    command = [sys.executable, "serving/main_mirrorapi.py"]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/live", 60, process=process, log_path=log)
        yield url, process
    finally:
        stop(process)


def metric(url: str, name: str, **labels) -> float:
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def outcomes(url: str) -> dict[str, float]:
    """/virtual answers from the cache and from the engine (`StubEngine.requests` also counts the start-up
    probe of each server)."""
    return {o: metric(url, "mirrorapi_requests_total", outcome=o) for o in ("hit", "simulated")}


def test_two_servers_on_one_postgresql_share_misses_hits_and_leases(postgres_database, tmp_path):
    with (
        StubEngine(delay=0.5) as engine,
        server_process(postgres_database, engine.url, tmp_path / "a.log") as (a, _),
        server_process(postgres_database, engine.url, tmp_path / "b.log") as (b, _),
    ):
        assert httpx.post(a + "/virtual", json=call("Messi"), timeout=30).json() == STUB_OBSERVATION
        assert httpx.post(b + "/virtual", json=call("Messi"), timeout=30).json() == STUB_OBSERVATION
        assert outcomes(a) == {"hit": 0, "simulated": 1} and outcomes(b) == {"hit": 1, "simulated": 0}
        simulations = engine.requests

        # The same new call at both servers at once: one engine call (a lease in the store), both answered.
        answers = {}
        threads = [
            threading.Thread(
                target=lambda u: answers.__setitem__(
                    u, httpx.post(u + "/virtual", json=call("Zidane"), timeout=30).json()
                ),
                args=(u,),
            )
            for u in (a, b)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers == {a: STUB_OBSERVATION, b: STUB_OBSERVATION}
        assert engine.requests == simulations + 1
        # One of the two waited for the other's answer (or, arriving after it was stored, found it: a hit).
        joined = sum(metric(u, "mirrorapi_coalesced_requests_total") for u in (a, b))
        hits = outcomes(a)["hit"] + outcomes(b)["hit"]
        assert joined + hits - 1 == 1
    # The store's hit counts agree with the servers' outcomes: a waiter given the other's answer is a coalesced
    # miss, where the store counted it a hit too (`cache stats` said hits that no server answered as one).
    cache = open_cache(postgres_database)
    try:
        assert cache.stats()["hits"] == hits
    finally:
        cache.close()


def test_workers_on_one_postgresql_cache(postgres_database, tmp_path):
    """`--workers 2` with `cache_url`: each worker opens the PostgreSQL store; what one stores, any serves."""
    with (
        StubEngine(delay=0.2) as engine,
        server_process(postgres_database, engine.url, tmp_path / "w.log", workers=2) as (url, _),
    ):

        def ask(n: int) -> dict:
            with httpx.Client(timeout=30) as http:  # a connection each: the kernel spreads them over the workers
                return http.post(url + "/virtual", json=call(f"player {n}")).json()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(ask, range(8))) == [STUB_OBSERVATION] * 8
            assert list(pool.map(ask, range(8))) == [STUB_OBSERVATION] * 8
        assert outcomes(url) == {"hit": 8, "simulated": 8}  # summed over the workers


def test_kill_9_of_a_server_loses_no_answer_it_gave(postgres_database, tmp_path):
    """Clients keep a server busy with misses; it is killed (SIGKILL) mid-load. Every call it answered is a
    hit in the other server afterwards: an answer is committed to the store before it is sent."""
    answered: list[str] = []
    lock = threading.Lock()
    stop_sending = threading.Event()

    def client(index: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            for n in range(40):  # bounded: 8 clients x 40 calls at most
                if stop_sending.is_set():
                    return
                name = f"client {index} call {n}"
                try:
                    reply = http.post("/virtual", json=call(name))
                except httpx.HTTPError:  # the server was killed under this request
                    return
                if reply.json() == STUB_OBSERVATION:
                    with lock:
                        answered.append(name)

    with StubEngine(delay=0.05) as engine, server_process(postgres_database, engine.url, tmp_path / "b.log") as (b, _):
        with server_process(postgres_database, engine.url, tmp_path / "a.log") as (a, victim):
            clients = [threading.Thread(target=client, args=(i, a)) for i in range(8)]
            for thread in clients:
                thread.start()
            poll_until(lambda: True if len(answered) >= 40 else None, 60, "40 answers from the server", 0.01)
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            stop_sending.set()
            for thread in clients:
                thread.join(60)
        assert victim.returncode == -signal.SIGKILL
        assert len(answered) >= 40
        with httpx.Client(base_url=b, timeout=30) as http:
            again = [http.post("/virtual", json=call(name)).json() for name in answered]
        assert again == [STUB_OBSERVATION] * len(answered)
        # None simulated again: every one was in the store.
        assert outcomes(b) == {"hit": len(answered), "simulated": 0}


EPISODE_1 = {"X-Session-Id": "episode-1"}


def test_a_killed_server_started_again_continues_its_sessions(cache_location, tmp_path):
    """Sessions live in the store: after `kill -9` and a new start, the next call of a session carries the
    history of the calls before the crash (its answer is stored under step 2, not as a new session's step 0)."""
    with StubEngine() as engine:
        with server_process(cache_location, engine.url, tmp_path / "first.log") as (url, server):
            for name in ("Messi", "Pele"):
                reply = httpx.post(url + "/virtual", json=call(name), headers=EPISODE_1, timeout=30)
                assert reply.json() == STUB_OBSERVATION
            assert httpx.get(url + "/health", timeout=10).json()["sessions"]["open"] == 1
            server.send_signal(signal.SIGKILL)
            server.wait(10)
        with server_process(cache_location, engine.url, tmp_path / "second.log") as (url, _):
            assert httpx.get(url + "/health", timeout=10).json()["sessions"]["open"] == 1
            reply = httpx.post(url + "/virtual", json=call("Zidane"), headers=EPISODE_1, timeout=30)
            assert reply.json() == STUB_OBSERVATION
            # A session the server never saw starts empty: its first call is the stateless call.
            httpx.post(url + "/virtual", json=call("Zidane"), headers={"X-Session-Id": "episode-2"}, timeout=30)
    cache = open_cache(cache_location)
    steps = sorted((json.loads(e.arguments)["name"], e.steps) for e in cache.rows() if e.history)
    assert steps == [("Pele", 1), ("Zidane", 2)]
    assert sorted(json.loads(e.arguments)["name"] for e in cache.rows() if not e.history) == ["Messi", "Zidane"]
    assert {row[0]: row[2] for row in cache.sessions()} == {"episode-1": 3, "episode-2": 1}


def test_sessions_idle_longer_than_the_ttl_are_forgotten_and_removed(cache_location):
    """A session unused for longer than `session_ttl` starts over, and the server's maintenance deletes it."""
    cache = open_cache(cache_location)
    now = time.time()
    cache.put_sessions(
        [("old", "digest-old", 3, '["a", "b", "c"]', now - 7200), ("recent", "digest-recent", 1, '["d"]', now - 60)]
    )

    async def check() -> None:
        assert await cache.session("old", idle_seconds=3600) is None  # expired: its next call starts over
        assert await cache.session("recent", idle_seconds=3600) == ("digest-recent", 1, ["d"])
        state = await cache.update_session("old", 3600, advance(8, 4096, "a new first line"))
        assert state[1] == 1 and state[2] == ["a new first line"]  # not step 4 of the expired history
        await cache.update_session("gone", 3600, advance(8, 4096, "x"))
        # 2,500 more expired ones, as an RL trainer's episodes leave them: one pass removes them all, though one
        # statement removes at most FORGET_SESSIONS_BATCH (one a pass fell behind 200 new sessions a second).
        cache.put_sessions([("older", "d", 2, "[]", now - 9000)])
        cache.put_sessions([(f"episode-{i}", "d", 1, "[]", now - 9000) for i in range(2500)])
        await cache.maintain(idle_seconds=3600)
        await cache.aclose()

    asyncio.run(check())
    cache = open_cache(cache_location)
    assert sorted(row[0] for row in cache.sessions()) == ["gone", "old", "recent"]
    assert cache.open_sessions(3600) == 3


def test_a_session_call_whose_store_stops_under_it_still_gets_its_answer(serve, tmp_path):
    """PostgreSQL stops while a session's call is with the engine: the engine's answer is given (unstored, the
    session not advanced), as a call outside a session gets it, not an internal error; the next call, with the store
    away, is told that the cache store is unavailable (`store_error`), not that the server has a bug."""
    with temporary_postgres(durable=False) as database, StubEngine(delay=1.5, model="stub") as engine:
        url = database.url + "?connect_timeout=3"
        with serve(api_base=[engine.url], model="stub", cache_url=url, engine_timeout=30) as server:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(
                    server.client.post, "/virtual", json=call("Zidane"), headers={"X-Session-Id": "s"}
                )
                poll_until(lambda: engine.answering == 1 or None, 10, "the call did not reach the engine")
                stop(database.process, grace=10.0)
                answered = pending.result(timeout=60)
            after = server.client.post("/virtual", json=call("Pele"), headers={"X-Session-Id": "s"})
    assert answered.json() == STUB_OBSERVATION and answered.headers["x-mirrorapi-outcome"] == "simulated"
    assert "the cache store is unavailable" in after.json()["error"]
    assert after.headers["x-mirrorapi-outcome"] == "store_error"


def test_a_lease_a_failed_store_left_is_let_go_once_the_store_is_back(serve, postgres_database):
    """A simulated answer is stored and its lease let go in one statement; when that statement failed (PostgreSQL
    restarted under the call: here, the server's connections terminated), the lease stayed until it expired
    (`engine_timeout` + 10 s), and another process asked the same call waited all that time for an answer never
    stored (36 s in the audit of 2026-12-01). The lease is let go as soon as the store answers again."""
    import psycopg

    def drop_connections() -> None:
        with psycopg.connect(postgres_database, autocommit=True) as db:
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid != pg_backend_pid()"
            )

    def count(table: str) -> int:
        with psycopg.connect(postgres_database, autocommit=True) as db:
            return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    with StubEngine(delay=1.5, model="stub") as engine:
        url = postgres_database + "?connect_timeout=3"
        with serve(api_base=[engine.url], model="stub", cache_url=url, engine_timeout=60) as server:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(server.client.post, "/virtual", json=call("Zidane"))
                poll_until(lambda: engine.answering == 1 or None, 10, "the call did not reach the engine")
                assert count("leases") == 1
                drop_connections()
                answered = pending.result(timeout=60)
            assert answered.json() == STUB_OBSERVATION and count("entries") == 0  # given, the store failed
            poll_until(lambda: count("leases") == 0 or None, 20, "the lease was not let go")


def test_a_call_whose_sqlite_lock_another_connection_holds_is_answered_and_stored_after(serve, tmp_path, monkeypatch):
    """Another connection holding the SQLite file's write lock (an import's transaction, a `sqlite3` shell left in
    one): a miss, whose answer is committed before it is sent, waited for ever (clients timed out at 120 s in the
    audit of 2026-12-01). After WRITE_WAIT_SECONDS (here 1 s) it is answered, its writes (the entry, the session)
    queued; they commit once the lock is free."""
    import sqlite3

    from mirrorapi.serving.cache import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "WRITE_WAIT_SECONDS", 1.0)
    path = tmp_path / "c.sqlite"
    with (
        StubEngine(model="stub") as engine,
        serve(api_base=[engine.url], model="stub", cache_path=str(path)) as server,
    ):
        assert server.client.post("/virtual", json=call("Messi")).json() == STUB_OBSERVATION  # the writer is open
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            answered = httpx.post(
                server.url + "/virtual", json=call("Zidane"), headers={"X-Session-Id": "s"}, timeout=30
            )
        finally:
            holder.execute("COMMIT")
            holder.close()
        assert answered.json() == STUB_OBSERVATION and answered.headers["x-mirrorapi-outcome"] == "simulated"

        def stored() -> bool | None:
            cache = open_cache(str(path))
            try:
                return cache.count() == 2 and cache.stats()["sessions"] == 1 or None
            finally:
                cache.close()

        poll_until(stored, 20, "the queued writes did not commit once the lock was free")
