"""A shared PostgreSQL store that stops under a running server: how long the server waits for it. Apart from
test_shared_store.py (whose helpers it uses) so that only this timed test runs after the busy part of `make test`
(tests/conftest.py: TIMES_ITSELF)."""

from __future__ import annotations

import time

import httpx

from harness.fake_engines import STUB_OBSERVATION, StubEngine
from harness.postgres_server import temporary_postgres
from harness.processes import stop

from .test_shared_store import call, server_process


def test_a_server_whose_postgresql_stops_says_so_on_health_and_in_observations(tmp_path):
    """The shared store goes away under a running server (its own PostgreSQL, stopped): /health answers 503
    naming the cache, not a 500, and a call gets an error observation; each waits for a connection no longer
    than the URL's `connect_timeout` (the default's 10 s would take the two past 20 s)."""
    with (
        temporary_postgres(durable=False) as database,
        StubEngine() as engine,
        server_process(database.url + "?connect_timeout=3", engine.url, tmp_path / "s.log") as (url, _),
    ):
        assert httpx.post(url + "/virtual", json=call("Messi"), timeout=30).json() == STUB_OBSERVATION
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 200 and health.json()["cache"]["entries"] == 1
        stop(database.process, grace=10.0)

        started = time.monotonic()
        health = httpx.get(url + "/health", timeout=60)
        assert health.status_code == 503, health.text
        assert health.json()["status"] == "unavailable" and "cache" in health.json()["misses"]
        assert "127.0.0.1" in health.json()["detail"]
        answer = httpx.post(url + "/virtual", json=call("Messi"), timeout=60)
        assert answer.status_code == 200 and answer.json()["error"] and answer.json()["response"] == ""
        # The deadline kept: two waits of 3 s (and whatever else the calls take), where the default connect_timeout
        # takes 10 s each. A timing that is the behaviour: this file is in tests/conftest.py's TIMES_ITSELF.
        assert time.monotonic() - started < 15
