"""The SQLite store's schema (the tables) and its migrations from every earlier version:
`open_schema` creates or migrates a database once, even with several processes opening it at once.

To change the schema: bump SCHEMA_VERSION (entries.py), write the new tables below and add a step to
`_MIGRATIONS` that rebuilds the previous version's tables (an old database must open and keep its entries).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from mirrorapi.serving.cache.entries import SCHEMA_VERSION, SIMULATED, CacheError, version_number

logger = logging.getLogger(__name__)

_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_ENTRIES = """
CREATE TABLE {name} (
    id INTEGER PRIMARY KEY AUTOINCREMENT, -- what hit counts are written by (never reused)
    category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL,
    arguments TEXT NOT NULL,              -- canonical_json of the argument object: the (order-insensitive) key
    history TEXT NOT NULL,                -- '' outside a session; else the digest of the session's earlier calls
    identity TEXT NOT NULL,               -- '' for recorded answers; the simulator identity for simulated ones
    steps INTEGER NOT NULL,               -- earlier calls of the session (0 outside one)
    arguments_as_sent TEXT NOT NULL,      -- the same arguments as first received, key order kept (export order)
    error TEXT NOT NULL,
    observation TEXT NOT NULL,            -- the whole {{"error", "response"}} answer, compact JSON
    provenance TEXT NOT NULL,             -- real | imported:<origin> | simulated:<identity>
    created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    rationale TEXT NOT NULL DEFAULT '')   -- CoT mode: the simulator's reasoning (kept, never served)
"""
# A rowid table and a narrow unique index, not a WITHOUT ROWID table: its b-tree would carry the rows
# (a kilobyte each) between the keys; the narrow index makes a random lookup a third faster (8 -> 5 us).
_ENTRIES_KEY = (
    "CREATE UNIQUE INDEX IF NOT EXISTS entries_key ON entries (category, tool, api, arguments, history, identity)"
)
_TABLES = (
    "CREATE TABLE IF NOT EXISTS imports (origin TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
    "entries INTEGER NOT NULL, imported_at REAL NOT NULL)",
    # lines: JSON array of the newest history lines, oldest first; used: when a call of it last came
    "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, digest TEXT NOT NULL, steps INTEGER NOT NULL, "
    "lines TEXT NOT NULL, used REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sessions_used ON sessions (used)",
    "CREATE TABLE IF NOT EXISTS leases (category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL, "
    "arguments TEXT NOT NULL, history TEXT NOT NULL, identity TEXT NOT NULL, holder TEXT NOT NULL, "
    "expires REAL NOT NULL, PRIMARY KEY (category, tool, api, arguments, history, identity)) WITHOUT ROWID",
)
_ENTRIES_V2 = (
    "CREATE TABLE {name} (category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL, arguments TEXT NOT "
    "NULL, identity TEXT NOT NULL, arguments_as_sent TEXT NOT NULL, error TEXT NOT NULL, observation TEXT NOT "
    "NULL, provenance TEXT NOT NULL, created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0, "
    "PRIMARY KEY (category, tool, api, arguments, identity)) WITHOUT ROWID"
)  # version 2, for migrating 1


_COLUMNS_V3 = (
    "category, tool, api, arguments, history, identity, steps, arguments_as_sent, error, observation, "
    "provenance, created, hits"
)
_COLUMNS = _COLUMNS_V3 + ", rationale"


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Version 1 had one entry per call. Recorded entries become shared ones; a simulated entry keeps
    the identity its provenance names (`<model>@<prompt format>`, decoding settings unknown), so it
    is kept, counted, exported and pruned under that name, but served only by a server told to serve
    exactly that identity (`simulator_identity`). Arguments as first received were not kept: the
    canonical (sorted) form stands in for them."""
    db.execute(_ENTRIES_V2.format(name="entries_v2"))
    db.execute(
        "INSERT INTO entries_v2 SELECT category, tool, api, arguments, CASE WHEN provenance LIKE "
        f"'{SIMULATED}%' THEN substr(provenance, {len(SIMULATED) + 1}) ELSE '' END, arguments, error, "
        "observation, provenance, created, hits FROM entries"
    )
    db.execute("DROP TABLE entries")
    db.execute("ALTER TABLE entries_v2 RENAME TO entries")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Version 2 kept answers given inside sessions in a table of their own (`session_entries`); version 3
    keys every answer by its call and the session history ('' outside a session), in one table."""
    db.execute(_ENTRIES.format(name="entries_v3"))
    db.execute(
        f"INSERT INTO entries_v3 ({_COLUMNS_V3}) SELECT category, tool, api, arguments, '', identity, 0, "
        "arguments_as_sent, error, observation, provenance, created, hits FROM entries"
    )
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'session_entries'").fetchone():
        db.execute(
            f"INSERT INTO entries_v3 ({_COLUMNS_V3}) SELECT category, tool, api, arguments, history, identity, "
            "steps, arguments, error, observation, provenance, created, 0 FROM session_entries"
        )
        db.execute("DROP TABLE session_entries")
    db.execute("DROP TABLE entries")
    db.execute("ALTER TABLE entries_v3 RENAME TO entries")


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """Version 4 keeps a CoT-mode simulation's rationale beside its answer (a table migrated from version 2 has
    the column already: version 3's table is built from today's definition)."""
    if "rationale" not in {row[1] for row in db.execute("PRAGMA table_info(entries)")}:
        db.execute("ALTER TABLE entries ADD COLUMN rationale TEXT NOT NULL DEFAULT ''")


_MIGRATIONS = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
}  # version n -> n + 1, all in one transaction at open


def open_schema(
    db: sqlite3.Connection, path: Path, transaction: Callable[[], contextlib.AbstractContextManager]
) -> None:
    """Create the tables of a new database, or migrate an older one, inside one `transaction`; CacheError for a
    database that is not a cache, or one written by a newer mirrorapi."""
    version = schema_version(db, path)
    if version == SCHEMA_VERSION:
        return
    with transaction():  # create or migrate, once, even with several processes opening at once
        db.execute(_META)
        version = schema_version(db, path)
        if version is None:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'entries'").fetchone():
                raise CacheError(f"{path}: has an entries table but no schema version")
            db.execute(_ENTRIES.format(name="entries"))
            db.execute(_ENTRIES_KEY)
        elif version > SCHEMA_VERSION:
            raise CacheError(
                f"{path}: cache schema version {version} was written by a newer mirrorapi; "
                f"this one reads versions up to {SCHEMA_VERSION}"
            )
        else:
            while version < SCHEMA_VERSION:
                logger.info("migrating cache %s from schema version %d to %d", path, version, version + 1)
                _MIGRATIONS[version](db)
                version += 1
            db.execute(_ENTRIES_KEY)
        for statement in _TABLES:
            db.execute(statement)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


def schema_version(db: sqlite3.Connection, path: Path) -> int | None:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no meta table: a new database
        return None
    return version_number(row[0], str(path)) if row else None
