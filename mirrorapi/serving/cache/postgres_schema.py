"""The PostgreSQL store's schema (the tables) and `open_schema`, which creates it on first use or brings a version-3
database to version 4; servers starting at once create it once (an advisory lock).

Version 3 is PostgreSQL's first: there is nothing older to migrate. The differences from the SQLite schema and
their reasons are in `postgres`'s module doc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirrorapi.serving.cache.entries import SCHEMA_VERSION, CacheError, version_number

if TYPE_CHECKING:
    import psycopg

_SCHEMA_LOCK = 0x6D697272  # pg_advisory_xact_lock key: servers starting at once create the schema once
_TEXT_KEY = 'TEXT COLLATE "C" NOT NULL'
_TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS entries (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        call BYTEA NOT NULL,                -- Call.digest(): category, tool, api, arguments, history
        category {_TEXT_KEY}, tool {_TEXT_KEY}, api {_TEXT_KEY},
        arguments {_TEXT_KEY},              -- canonical_json of the argument object
        history {_TEXT_KEY},                -- '' outside a session
        identity {_TEXT_KEY},               -- '' for recorded answers
        steps INTEGER NOT NULL,
        arguments_as_sent TEXT NOT NULL,
        error TEXT NOT NULL,
        observation TEXT NOT NULL,          -- the whole {{"error", "response"}} answer, compact JSON
        provenance TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        hits BIGINT NOT NULL DEFAULT 0,
        rationale TEXT NOT NULL DEFAULT '',  -- CoT mode: the simulator's reasoning (kept, never served)
        UNIQUE (call, identity))""",
    # Few-shot examples and the removal of simulated answers a recording shadows look an API's rows up.
    "CREATE INDEX IF NOT EXISTS entries_api ON entries (category, tool, api)",
    "CREATE TABLE IF NOT EXISTS imports (origin TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
    "entries INTEGER NOT NULL, imported_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions (key BYTEA PRIMARY KEY, id TEXT NOT NULL, digest TEXT NOT NULL, "
    "steps INTEGER NOT NULL, lines TEXT NOT NULL, used DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sessions_used ON sessions (used)",
    "CREATE TABLE IF NOT EXISTS leases (call BYTEA NOT NULL, identity TEXT NOT NULL, holder TEXT NOT NULL, "
    "expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (call, identity))",
)
TABLE_NAMES = ("meta", "entries", "imports", "sessions", "leases")


def open_schema(db: psycopg.Connection, location: str) -> None:
    """Create the tables on a new database (`db`: a psycopg connection in autocommit mode), or bring a version-3
    one to this version; CacheError for a database holding someone else's `entries` or a newer schema."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        db.execute(_TABLES[0])
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = version_number(row[0], location) if row else None
        if version is not None and version > SCHEMA_VERSION:
            raise CacheError(
                f"{location}: cache schema version {version} was written by a newer "
                f"mirrorapi; this one reads versions up to {SCHEMA_VERSION}"
            )
        if version is None:
            exists = db.execute("SELECT to_regclass('entries') IS NOT NULL").fetchone()[0]  # type: ignore[index]
            if exists:
                raise CacheError(
                    f"{location}: has an entries table but no mirrorapi schema version "
                    "(give the cache a database, or a schema, of its own)"
                )
            # Version 3 is PostgreSQL's first: there is nothing older to migrate.
            for statement in _TABLES[1:]:
                db.execute(statement)
            db.execute("INSERT INTO meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))
        elif version == 3:  # version 4 keeps a CoT-mode simulation's rationale beside its answer
            db.execute("ALTER TABLE entries ADD COLUMN IF NOT EXISTS rationale TEXT NOT NULL DEFAULT ''")
            db.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
