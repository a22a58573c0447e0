"""Simulator identities: a simulated answer belongs to the simulator that gave it (model, prompt format,
decoding settings); recorded answers are shared; old (schema 1) databases open and keep their entries;
`mirrorapi cache stats | export | prune` per identity."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from harness.fake_engines import STUB_OBSERVATION
from mirrorapi.cli import main
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import CacheError, Entry, ResponseCache, new_entry, open_cache
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.simulator import simulator_identity

from .conftest import store_settings

API = ("Data", "theclique", "transfermarkt_search")
MESSI = {"name": "Lionel Messi"}
BODY = {
    "category": "Data",
    "tool_name": "theclique",
    "api_name": "transfermarkt_search",
    "tool_input": json.dumps(MESSI),
    "strip": "truncate",
    "toolbench_key": "",
}


def identity(samples, **settings) -> str:
    return simulator_identity(
        load_settings(overrides={"tools_folder": [str(samples / "tools")], **settings}, environ={})
    )


def test_identity_names_what_changes_answers(samples, tmp_path):
    base = identity(samples, model="sim-a")
    assert base == "sim-a@mirrorapi-v1,temperature=0,structured_output=on,few_shot=0,second_try=0.7"
    changed = [
        identity(samples, model="sim-b"),
        identity(samples, model="sim-a", second_try_temperature=0),
        identity(samples, model="sim-a", temperature=0.7),
        identity(samples, model="sim-a", structured_output=False),
        identity(samples, model="sim-a", few_shot=3),
    ]
    for n, text in enumerate(("released system prompt", "another system prompt")):
        (tmp_path / f"system{n}.txt").write_text(text, encoding="utf-8")
        changed.append(
            identity(
                samples,
                model="sim-a",
                prompt_format="stabletoolbench",
                system_prompt_file=str(tmp_path / f"system{n}.txt"),
            )
        )
    assert len(set(changed) | {base}) == len(changed) + 1
    assert identity(samples, model="sim-a", max_tokens=99, engine_timeout=5) == base  # no effect on a whole answer
    assert identity(samples, model="sim-a", simulator_identity="published-run-7") == "published-run-7"


def test_each_identity_has_its_own_simulated_answers_and_recorded_ones_are_shared(cache_location):
    cache = open_cache(cache_location)
    key = canonical_json(MESSI)
    assert cache.put(*API, MESSI, "", "A's answer", "simulated:A")
    assert cache.put(*API, MESSI, "", "B's answer", "simulated:B")  # B does not get A's: it simulates and stores
    assert not cache.put(*API, MESSI, "", "A again", "simulated:A")  # one answer per identity: the first stays
    assert cache.get(*API, key, "A") == ('{"error":"","response":"A\'s answer"}', "simulated:A")
    assert cache.get(*API, key, "B") == ('{"error":"","response":"B\'s answer"}', "simulated:B")
    assert cache.get(*API, key, "C") is None and cache.get(*API, key) is None
    assert cache.identities() == {"A": 1, "B": 1}
    assert cache.put(*API, MESSI, "", "recorded", "real")  # a recording replaces every simulation of the call
    assert cache.get(*API, key, "A") == cache.get(*API, key, "C") == ('{"error":"","response":"recorded"}', "real")
    assert cache.count() == 1 and not cache.put(*API, MESSI, "", "C's answer", "simulated:C")


def test_a_server_never_serves_another_simulators_answer(serve, engine_stub, samples, cache_location):
    old = identity(samples, model="old-simulator")
    cache = open_cache(cache_location)
    cache.put(*API, MESSI, "", "the old simulator's answer", "simulated:" + old)
    cache.close()
    with serve(api_base=[engine_stub()], model="new-simulator", **store_settings(cache_location)) as server:
        assert server.virtual(BODY).json() == STUB_OBSERVATION  # simulated by the new model, not the old answer
        assert server.virtual(BODY).json() == STUB_OBSERVATION
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 1
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 1
    new = identity(samples, model="new-simulator")
    assert open_cache(cache_location).identities() == {new: 1, old: 1}
    # A published run is replayed exactly by naming its identity.
    with serve(mode="replay", simulator_identity=old, **store_settings(cache_location)) as server:
        assert server.virtual(BODY).json() == {"error": "", "response": "the old simulator's answer"}


# --------------------------------------------------------------------------------- old databases
# The schema mirrorapi wrote before simulator identities (schema version 1), as it created it.
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL, arguments TEXT NOT NULL, error TEXT NOT NULL,
    observation TEXT NOT NULL, provenance TEXT NOT NULL, created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (category, tool, api, arguments)) WITHOUT ROWID;
CREATE TABLE imports (origin TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, entries INTEGER NOT NULL,
    imported_at REAL NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO entries VALUES ('Data', 'theclique', 'transfermarkt_search', '{"name":"Messi"}', '',
    '{"error":"","response":"real Messi"}', 'real', 1.0, 4);
INSERT INTO entries VALUES ('Data', 'theclique', 'transfermarkt_search', '{"name":"Pele"}', '',
    '{"error":"","response":"imported Pele"}', 'imported:tool_response_cache', 2.0, 0);
INSERT INTO entries VALUES ('Data', 'theclique', 'transfermarkt_search', '{"name":"Zidane"}', '',
    '{"error":"","response":"simulated Zidane"}', 'simulated:m@mirrorapi-v1', 3.0, 2);
INSERT INTO imports VALUES ('/data/tool_response_cache', 'f', 1, 2.0);
"""


def test_a_schema_1_database_opens_and_keeps_its_entries(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.close()
    cache = ResponseCache(path)
    stats = cache.stats()
    assert (stats["entries"], stats["recorded"], stats["hits"]) == (3, 2, 6)
    assert stats["imports"][0]["origin"] == "/data/tool_response_cache"
    # Recorded answers: served to every simulator. The old simulated one: under its provenance's name only.
    assert cache.get(*API, '{"name":"Messi"}', "any-model@mirrorapi-v1,temperature=0")[1] == "real"
    assert cache.get(*API, '{"name":"Pele"}')[1] == "imported:tool_response_cache"
    assert cache.get(*API, '{"name":"Zidane"}', "m@mirrorapi-v1,temperature=0,structured_output=on,few_shot=0") is None
    assert cache.get(*API, '{"name":"Zidane"}', "m@mirrorapi-v1") == (
        '{"error":"","response":"simulated Zidane"}',
        "simulated:m@mirrorapi-v1",
    )
    cache.close()
    assert sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    ResponseCache(path).close()  # opens again as is


# Version 3 as mirrorapi wrote it (the 2026-11-25 release): entries without the CoT rationale column.
SCHEMA_3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL,
    arguments TEXT NOT NULL, history TEXT NOT NULL, identity TEXT NOT NULL, steps INTEGER NOT NULL,
    arguments_as_sent TEXT NOT NULL, error TEXT NOT NULL, observation TEXT NOT NULL, provenance TEXT NOT NULL,
    created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX entries_key ON entries (category, tool, api, arguments, history, identity);
INSERT INTO meta VALUES ('schema_version', '3');
INSERT INTO entries (category, tool, api, arguments, history, identity, steps, arguments_as_sent, error,
    observation, provenance, created, hits) VALUES ('Data', 'theclique', 'transfermarkt_search',
    '{"name":"Zidane"}', '', 'm@stabletoolbench-cot', 0, '{"name":"Zidane"}', '',
    '{"error":"","response":"simulated Zidane"}', 'simulated:m@stabletoolbench-cot', 3.0, 2);
"""


def test_a_schema_3_database_opens_with_its_entries_and_keeps_rationales_from_then_on(tmp_path):
    path = tmp_path / "v3.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_3)
    db.close()
    cache = ResponseCache(path)
    (old,) = cache.rows()
    assert (old.observation, old.hits, old.rationale) == ('{"error":"","response":"simulated Zidane"}', 2, "")
    cot = "m@stabletoolbench-cot"
    asyncio.run(
        cache.store(
            Entry(
                *API,
                '{"name":"Kaka"}',
                "",
                cot,
                0,
                '{"name":"Kaka"}',
                "",
                '{"error":"","response":"Kaka"}',
                "simulated:" + cot,
                4.0,
                rationale="why",
            )
        )
    )
    asyncio.run(cache.aclose())
    assert {e.arguments: e.rationale for e in ResponseCache(path).rows()} == {
        '{"name":"Zidane"}': "",
        '{"name":"Kaka"}': "why",
    }


def test_a_database_of_a_newer_mirrorapi_is_a_clear_error(cache_location):
    cache = open_cache(cache_location)
    with cache._transaction():
        cache._execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    cache.close()
    with pytest.raises(
        CacheError, match="schema version 9 was written by a newer mirrorapi; this one reads versions up to 4"
    ):
        open_cache(cache_location)


# ----------------------------------------------------------------------------------------- CLI
def test_stats_export_and_prune_per_identity(cache_location, tmp_path, capsys):
    db = cache_location
    cache = open_cache(db)
    cache.put(*API, {"name": "Messi"}, "", "recorded", "real")
    cache.put(*API, {"name": "Pele"}, "", "A on Pele", "simulated:A")
    cache.put(*API, {"name": "Pele"}, "", "B on Pele", "simulated:B")
    cache.put(*API, {"name": "Zico"}, "", "B on Zico", "simulated:B")
    cache.close()
    assert main(["cache", "stats", "--cache", db]) == 0
    out = capsys.readouterr().out
    assert "recorded:   1 (shared by every simulator)\n" in out
    assert "simulated:  3 in 2 simulator identities\n  A: 1 entries, 0 hits\n  B: 2 entries, 0 hits\n" in out

    assert main(["cache", "export", str(tmp_path / "out"), "--cache", db]) == 2
    assert (
        "holds simulated answers of 2 simulator identities; name one with --identity (A, B)" in capsys.readouterr().err
    )
    assert main(["cache", "export", str(tmp_path / "out"), "--cache", db, "--identity", "B"]) == 0
    assert capsys.readouterr().out.startswith("3 entries written to 1 files")
    exported = json.loads((tmp_path / "out/Data/theclique_for_Data/transfermarkt_search.json").read_text())
    assert {k: v["response"] for k, v in exported.items()} == {
        "{'name': 'Messi'}": "recorded",
        "{'name': 'Pele'}": "B on Pele",
        "{'name': 'Zico'}": "B on Zico",
    }

    assert main(["cache", "prune", "--cache", db, "--identity", "B"]) == 0
    assert capsys.readouterr().out == f"2 simulated answers of B deleted from {db}\n"
    assert main(["cache", "prune", "--cache", db, "--identity", "B"]) == 2
    assert "no simulated answers of identity 'B'" in capsys.readouterr().err
    assert open_cache(db).identities() == {"A": 1}


def test_a_database_whose_schema_version_is_not_a_number_is_a_clear_error(cache_location):
    cache = open_cache(cache_location)
    with cache._transaction():
        cache._execute("UPDATE meta SET value = 'four' WHERE key = 'schema_version'")
    cache.close()
    with pytest.raises(CacheError, match="unreadable cache schema version 'four'"):  # was int()'s ValueError
        open_cache(cache_location)


def test_answers_inside_sessions_and_a_recorded_only_export_name_no_identity(cache_location, tmp_path, capsys):
    """A server used with and without sessions stores two identities (the session one's answers are never exported):
    a plain export and the documented `--provenance real imported` once failed as holding two simulators."""
    db = cache_location
    cache = open_cache(db)
    cache.put(*API, {"name": "Messi"}, "", "recorded", "real")
    cache.put(*API, {"name": "Pele"}, "", "A on Pele", "simulated:A")

    async def in_a_session() -> None:
        await cache.store(new_entry(*API, {"name": "Kaka"}, "", "in a session", "simulated:A+s", 5.0, "digest", 1))
        await cache.aclose()

    asyncio.run(in_a_session())
    assert main(["cache", "export", str(tmp_path / "plain"), "--cache", db]) == 0
    assert capsys.readouterr().out.startswith("2 entries written to 1 files")
    cache = open_cache(db)
    cache.put(*API, {"name": "Zico"}, "", "B on Zico", "simulated:B")  # now two simulators outside sessions
    cache.close()
    assert main(["cache", "export", str(tmp_path / "real"), "--cache", db, "--provenance", "real", "imported"]) == 0
    assert capsys.readouterr().out.startswith("1 entries written to 1 files")
