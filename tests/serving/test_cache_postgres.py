"""What only the PostgreSQL store has: `mirrorapi cache migrate` between stores, and the errors of a URL
(the behaviour both stores share is tested on both: `cache_location`)."""

from __future__ import annotations

import asyncio
import json
import threading

import psycopg
import pytest

from harness.processes import free_port
from mirrorapi.cli import main
from mirrorapi.serving.cache import CacheError, Call, Entry, new_entry, open_cache
from mirrorapi.serving.cache.postgres import connection_string, wait_seconds
from mirrorapi.serving.config import ConfigError, load_settings
from mirrorapi.serving.sessions import advance

from .conftest import SAMPLE_TOOLS

API = ("Data", "theclique", "transfermarkt_search")


def fill(location: str) -> None:
    """A cache with every kind of row: recorded and simulated answers, an answer inside a session, a session,
    an import record and hit counts."""
    cache = open_cache(location)
    cache.put(*API, {"name": "Messi", "club": "Inter Miami"}, "", "real Messi", "real")
    cache.put(*API, {"name": "Pele"}, "", "imported Pele", "imported:tool_response_cache")
    cache.put(*API, {"name": "Zico"}, "", "A on Zico", "simulated:A")
    cache.put(*API, {"name": "Zico"}, "", "B on Zico", "simulated:B")
    cache.record_import("/data/tool_response_cache", "fingerprint", 1)
    cache.get(*API, '{"club":"Inter Miami","name":"Messi"}')
    cache.get(*API, '{"club":"Inter Miami","name":"Messi"}')

    async def in_a_session() -> None:
        await cache.store(
            new_entry(*API, {"name": "Kaka"}, "", "A on Kaka, step 1", "simulated:A", 5.0, history="digest-1", steps=1)
        )
        await cache.update_session("episode-1", 3600, advance(8, 4096, "a line"))
        assert await cache.lookup(Call(*API, '{"name":"Kaka"}', "digest-1"), "A") is not None
        await cache.aclose()

    asyncio.run(in_a_session())


def snapshot(location: str) -> dict:
    cache = open_cache(location)
    try:
        stats = cache.stats()
        return {
            "entries": sorted(cache.rows(), key=lambda e: (e.arguments, e.identity)),
            "sessions": [row[:4] for row in cache.sessions()],
            "imports": [row[:3] for row in cache.imports()],
            "stats": {
                k: stats[k]
                for k in ("entries", "hits", "recorded", "by_identity", "by_provenance", "session_entries", "sessions")
            },
        }
    finally:
        cache.close()


def test_migrate_copies_sqlite_into_postgresql_and_back(postgres_database, tmp_path, capsys):
    sqlite = tmp_path / "c.sqlite"
    fill(str(sqlite))
    before = snapshot(str(sqlite))
    assert before["stats"]["entries"] == 5 and before["stats"]["hits"] == 3 and before["sessions"]

    assert main(["cache", "migrate", "--from", f"sqlite:///{sqlite}", "--to", postgres_database]) == 0
    assert capsys.readouterr().out == (
        f"5 of 5 entries and 1 sessions copied from {sqlite} to {postgres_database} "
        "(entries it held already were kept)\n"
    )
    assert snapshot(postgres_database) == before  # every column: times, hits, arguments as sent, sessions
    # Again (an interrupted migration is simply run again): nothing doubles.
    assert main(["cache", "migrate", "--from", str(sqlite), "--to", postgres_database, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["entries_read"], report["entries_copied"], report["sessions_copied"]) == (5, 0, 0)
    assert snapshot(postgres_database) == before

    back = tmp_path / "back.sqlite"  # a snapshot of the shared cache, e.g. to export or share a run
    assert main(["cache", "migrate", "--from", postgres_database, "--to", str(back)]) == 0
    assert snapshot(str(back)) == before


def test_migrate_checks_the_source_exists(postgres_database, tmp_path, capsys):
    assert main(["cache", "migrate", "--from", str(tmp_path / "none.sqlite"), "--to", postgres_database]) == 2
    assert (
        capsys.readouterr().err
        == f"mirrorapi cache migrate: error: cache database not found: {tmp_path / 'none.sqlite'}\n"
    )


def test_an_unreachable_server_is_one_line_without_the_password(capsys):
    url = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/cache"
    assert main(["cache", "stats", "--cache", url]) == 2
    error = capsys.readouterr().err
    address = url.split("@")[1]
    assert error.startswith(
        f"mirrorapi cache stats: error: cannot open cache database postgresql://postgres@{address}: "
    )
    assert error.count("\n") == 1 and "s3cret" not in error


def test_a_database_with_tables_of_something_else_is_refused(postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as db:
        db.execute("CREATE TABLE entries (id integer)")
    with pytest.raises(CacheError, match="has an entries table but no mirrorapi schema version"):
        open_cache(postgres_database)


def test_cache_url_must_be_postgresql():
    with pytest.raises(ConfigError, match="cache_url: expected postgresql://"):
        load_settings(overrides={"tools_folder": [str(SAMPLE_TOOLS)], "cache_url": "mysql://db/cache"}, environ={})


def test_servers_starting_together_create_the_schema_once(postgres_database):
    """Several processes opening a new database at once (servers starting together): one creates the tables,
    the others wait for it and use them."""
    errors, caches = [], []

    def open_one() -> None:
        try:
            caches.append(open_cache(postgres_database))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(caches) == 8
    for cache in caches:
        cache.close()


def test_a_connection_the_database_dropped_is_an_error_once_then_connected_again(postgres_database):
    """PostgreSQL restarted (here: the server's connections terminated): the call that meets the drop fails with
    a one-line CacheError; the next ones connect again, on the admin connection and on the request path."""
    cache = open_cache(postgres_database)
    cache.put(*API, {"name": "Messi"}, "", "real Messi", "real")

    def drop_connections() -> None:
        with psycopg.connect(postgres_database, autocommit=True) as db:
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid != pg_backend_pid()"
            )

    drop_connections()
    with pytest.raises(CacheError, match="^cache database postgresql://"):
        cache.count()
    assert cache.count() == 1

    async def request_path() -> list:
        call = Call(*API, '{"name":"Messi"}')
        assert await cache.lookup(call, "A") is not None  # opens the pool
        drop_connections()
        answers = []
        for _ in range(3):
            try:
                answers.append(await cache.lookup(call, "A"))
            except CacheError:
                answers.append("error")
        await cache.aclose()
        return answers

    answers = asyncio.run(request_path())
    assert answers[-1] is not None and answers[-1] != "error" and answers.count("error") <= 1


def test_a_version_3_database_gets_the_rationale_column_and_keeps_its_entries(postgres_database):
    """Version 3 (before CoT rationales were kept) as the same tables without the column: opening it adds the
    column, the entries stay, and new answers keep their rationale."""
    cache = open_cache(postgres_database)
    cache.put(*API, {"name": "Messi"}, "", "real Messi", "real")
    cache.close()
    with psycopg.connect(postgres_database, autocommit=True) as db:
        db.execute("ALTER TABLE entries DROP COLUMN rationale")
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    cache = open_cache(postgres_database)
    (old,) = cache.rows()
    assert (json.loads(old.observation)["response"], old.rationale) == ("real Messi", "")

    async def store_one_with_a_rationale() -> None:
        await cache.store(
            Entry(
                *API,
                '{"name":"Kaka"}',
                "",
                "A",
                0,
                '{"name":"Kaka"}',
                "",
                '{"error":"","response":"Kaka"}',
                "simulated:A",
                2.0,
                rationale="why",
            )
        )
        assert {e.arguments: e.rationale for e in cache.rows()} == {'{"name":"Messi"}': "", '{"name":"Kaka"}': "why"}
        await cache.aclose()

    asyncio.run(store_one_with_a_rationale())
    with psycopg.connect(postgres_database) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)


@pytest.mark.parametrize(
    ("query", "seconds"),
    [("", 10.0), ("?connect_timeout=3", 3.0), ("?connect_timeout=0", 10.0), ("?connect_timeout=-1", 10.0)],
)
def test_a_request_waits_for_a_connection_as_long_as_the_url_lets_one_open(query, seconds):
    """libpq's `connect_timeout` (https://www.postgresql.org/docs/current/libpq-connect.html): seconds to wait
    while connecting, zero or less for ever. A request waits that long for a pool connection; for ever (or no
    value) is the server's own 10 s, since a server must not hold a request for ever."""
    url = "postgresql://postgres@127.0.0.1:5432/postgres" + query
    assert wait_seconds(connection_string(url)) == seconds


def test_a_recording_imported_while_a_server_simulates_the_call_is_what_the_export_writes(postgres_database, tmp_path):
    # Two PostgreSQL transactions at once: an import's slice writes the call's recording while a server stores its
    # simulation of it; neither sees the other's row, so both stay. A server answers the recording (served()); the
    # export wrote the simulation.
    from mirrorapi.serving.cache import export_stabletoolbench_cache

    importer, server = open_cache(postgres_database), open_cache(postgres_database)
    recorded = new_entry(*API, {"name": "Messi"}, "", "RECORDED", "real", 1.0)
    simulated = new_entry(*API, {"name": "Messi"}, "", "SIMULATED", "simulated:m@f", 2.0)
    with importer._transaction():  # one slice of `cache import`, still open
        importer._write_entries([recorded])
        assert asyncio.run(server.store(simulated, "holder"))
    report = export_stabletoolbench_cache(importer, tmp_path / "export", identity="m@f")
    written = json.loads((tmp_path / "export" / API[0] / f"{API[1]}_for_{API[0]}" / f"{API[2]}.json").read_text())
    assert report["entries"] == 1 and written == {"{'name': 'Messi'}": {"error": "", "response": "RECORDED"}}
    importer.close()
    server.close()
