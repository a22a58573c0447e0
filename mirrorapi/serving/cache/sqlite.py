"""The embedded store: the response cache in one SQLite file in WAL mode (`ResponseCache`).

Every write is a committed transaction, so a process killed at any moment leaves a database that
opens with every entry committed before (WAL replays on open). Several processes may share the file
(uvicorn's workers, an import beside a server): WAL readers never block, and writers take turns.

On a server, every write happens on the event loop, never in a thread (a thread fights the loop for
the GIL, which cost misses a tenth of their throughput: issue 21), and never blocks it: the writes of
one loop turn are committed together on a connection that does not wait for SQLite's lock. When
another process holds the lock (an import), the commit is tried again every millisecond, and the
loop goes on serving meanwhile; nothing handed over is dropped (`LoopWriter`). Hit counts are kept
in memory and written by `maintain()` in slices of HIT_FLUSH_ROWS, so a cache hit costs one indexed
read and no write.

The key is a readable unique index on (category, tool, api, arguments, history, identity): a lookup of a
call outside a session reads the few rows of (call, '') by equality on the key's prefix, which SQLite
answers in about half the time of an `identity IN (...)` condition (bench/server.py's hit path). New
databases get 16 KiB pages: with rows of about a kilobyte, 4 KiB pages filled half and doubled the file.

(About 410 lines, a little over the project's ~400: the schema, its migrations and the store that runs them are
read together; the server's writer is `sqlite_writer`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from mirrorapi.serving.cache.base import (
    HIT_FLUSH_ROWS,
    NO_SESSION,
    RECORDED,
    SCHEMA_VERSION,
    SIMULATED,
    CacheError,
    Call,
    Entry,
    SqlCache,
)
from mirrorapi.serving.cache.sqlite_writer import LoopWriter

logger = logging.getLogger(__name__)

CHECKPOINT_WRITES = 250  # writer commits between checkpoints (in a thread) of a server's cache
# The WAL file's bound: SQLite truncates it to this size whenever a checkpoint starts it over
# (journal_size_limit), and a server's maintenance truncates it whole (a TRUNCATE checkpoint) when it is found
# larger. Without it the file keeps its largest size for ever: 6.77 GB after a burst of big session writes.
WAL_LIMIT_BYTES = 64 * 1024 * 1024

# ------------------------------------------------------------------------------- schema
# To change the schema: bump SCHEMA_VERSION (base.py), write the new tables below and add a step to
# `_MIGRATIONS` that rebuilds the previous version's tables (an old database must open and keep its entries).
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
_ENTRIES_KEY = ("CREATE UNIQUE INDEX IF NOT EXISTS entries_key ON entries "
                "(category, tool, api, arguments, history, identity)")
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
_ENTRIES_V2 = ("CREATE TABLE {name} (category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL, arguments TEXT NOT "
               "NULL, identity TEXT NOT NULL, arguments_as_sent TEXT NOT NULL, error TEXT NOT NULL, observation TEXT NOT "
               "NULL, provenance TEXT NOT NULL, created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0, "
               "PRIMARY KEY (category, tool, api, arguments, identity)) WITHOUT ROWID")  # version 2, for migrating 1


_COLUMNS_V3 = "category, tool, api, arguments, history, identity, steps, arguments_as_sent, error, observation, " \
              "provenance, created, hits"
_COLUMNS = _COLUMNS_V3 + ", rationale"


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Version 1 had one entry per call. Recorded entries become shared ones; a simulated entry keeps
    the identity its provenance names (`<model>@<prompt format>`, decoding settings unknown), so it
    is kept, counted, exported and pruned under that name, but served only by a server told to serve
    exactly that identity (`simulator_identity`). Arguments as first received were not kept: the
    canonical (sorted) form stands in for them."""
    db.execute(_ENTRIES_V2.format(name="entries_v2"))
    db.execute("INSERT INTO entries_v2 SELECT category, tool, api, arguments, CASE WHEN provenance LIKE "
               f"'{SIMULATED}%' THEN substr(provenance, {len(SIMULATED) + 1}) ELSE '' END, arguments, error, "
               "observation, provenance, created, hits FROM entries")
    db.execute("DROP TABLE entries")
    db.execute("ALTER TABLE entries_v2 RENAME TO entries")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Version 2 kept answers given inside sessions in a table of their own (`session_entries`); version 3
    keys every answer by its call and the session history ('' outside a session), in one table."""
    db.execute(_ENTRIES.format(name="entries_v3"))
    db.execute(f"INSERT INTO entries_v3 ({_COLUMNS_V3}) SELECT category, tool, api, arguments, '', identity, 0, "
               "arguments_as_sent, error, observation, provenance, created, hits FROM entries")
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'session_entries'").fetchone():
        db.execute(f"INSERT INTO entries_v3 ({_COLUMNS_V3}) SELECT category, tool, api, arguments, history, identity, "
                   "steps, arguments, error, observation, provenance, created, 0 FROM session_entries")
        db.execute("DROP TABLE session_entries")
    db.execute("DROP TABLE entries")
    db.execute("ALTER TABLE entries_v3 RENAME TO entries")


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """Version 4 keeps a CoT-mode simulation's rationale beside its answer (a table migrated from version 2 has
    the column already: version 3's table is built from today's definition)."""
    if "rationale" not in {row[1] for row in db.execute("PRAGMA table_info(entries)")}:
        db.execute("ALTER TABLE entries ADD COLUMN rationale TEXT NOT NULL DEFAULT ''")


_MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4}  # version n -> n + 1, all in one transaction at open

_INSERT = (f"INSERT OR IGNORE INTO entries ({_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
           "?13, ?14)")
# A simulated answer is not stored where a recorded one exists (it would never be served)...
_INSERT_SIMULATED = (f"INSERT OR IGNORE INTO entries ({_COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                     "?11, ?12, ?13, ?14 WHERE NOT EXISTS (SELECT 1 FROM entries WHERE category = ?1 AND tool = ?2 AND "
                     "api = ?3 AND arguments = ?4 AND history = '' AND identity = '')")
# ... and a recorded answer replaces every simulated answer of the same call. The first recording stays.
_DROP_SHADOWED = "DELETE FROM entries WHERE category = ? AND tool = ? AND api = ? AND arguments = ? AND identity != ''"
# Equality on the key's prefix: the recorded row or the simulated rows of each identity (a few at most).
# The request path reads the observation as bytes: it is the response body as stored (no decode, no encode).
_SELECT = "SELECT id, {}, provenance, identity, history FROM entries WHERE category = ? AND tool = ? AND api = ? " \
          "AND arguments = ? AND "
_FIND = _SELECT.format("observation") + "history = ''"
_FIND_IN_SESSION = _SELECT.format("observation") + "history IN ('', ?)"
_LOOKUP = _SELECT.format("CAST(observation AS BLOB)") + "history = ''"
_LOOKUP_IN_SESSION = _SELECT.format("CAST(observation AS BLOB)") + "history IN ('', ?)"
_COUNT_HITS = "UPDATE entries SET hits = hits + ? WHERE id = ?"
_TAKE_LEASE = ("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET holder = excluded.holder, "
               "expires = excluded.expires WHERE leases.expires < ? OR leases.holder = excluded.holder")
_RELEASE_LEASE = ("DELETE FROM leases WHERE category = ? AND tool = ? AND api = ? AND arguments = ? AND history = ? "
                  "AND identity = ? AND holder = ?")


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    # isolation_level=None: autocommit, each statement (or explicit BEGIN block) one transaction.
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA page_size=16384")  # a new database's (an existing one keeps its own)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes in WAL mode
    db.execute(f"PRAGMA journal_size_limit={int(WAL_LIMIT_BYTES)}")
    # Reads from a memory map, not a read() call per page: a third less CPU per lookup of a
    # 50 MB cache (20,000 entries, bench/server.py). Address space only; the OS shares the pages.
    db.execute("PRAGMA mmap_size=1073741824")
    return db


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _write_entries(db: sqlite3.Connection, entries: Iterable[Entry]) -> int:
    """Insert entries (inside a transaction) by the rules of the cache; returns how many were stored."""
    stored = 0
    for entry in entries:
        row = (entry.category, entry.tool, entry.api, entry.arguments, entry.history, entry.identity, entry.steps,
               entry.arguments_as_sent, entry.error, entry.observation, entry.provenance, entry.created, entry.hits,
               entry.rationale)
        if entry.identity:  # simulated
            stored += db.execute(_INSERT_SIMULATED, row).rowcount
        else:
            inserted = db.execute(_INSERT, row).rowcount
            if inserted:
                db.execute(_DROP_SHADOWED, row[:4])
            stored += inserted
    return stored


class ResponseCache(SqlCache):
    """The cache in the SQLite file `path` (see the module doc). `autocheckpoint=False`: the owner calls
    `maintain()`, which checkpoints in a thread (a checkpoint syncs the disk)."""

    def __init__(self, path: str | os.PathLike, busy_timeout: float = 10.0, autocheckpoint: bool = True):
        self.path = Path(path)
        self.location = str(self.path)
        self._pending_hits: dict[int, int] = {}  # entry id -> hits not written yet
        self._writer: LoopWriter | None = None
        self._autocheckpoint = autocheckpoint
        self._commits = 0  # writer commits since the last checkpoint
        self._checkpointing: asyncio.Future | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = _connect(self.path, busy_timeout)
            if not autocheckpoint:
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._open_schema()
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(f"cannot open cache database {self.path}: {exc}") from None

    def _open_schema(self) -> None:
        db = self._db
        version = self._schema_version()
        if version == SCHEMA_VERSION:
            return
        with self._transaction():  # create or migrate, once, even with several processes opening at once
            db.execute(_META)
            version = self._schema_version()
            if version is None:
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'entries'").fetchone():
                    raise CacheError(f"{self.path}: has an entries table but no schema version")
                db.execute(_ENTRIES.format(name="entries"))
                db.execute(_ENTRIES_KEY)
            elif version > SCHEMA_VERSION:
                raise CacheError(f"{self.path}: cache schema version {version} was written by a newer mirrorapi; "
                                 f"this one reads versions up to {SCHEMA_VERSION}")
            else:
                while version < SCHEMA_VERSION:
                    logger.info("migrating cache %s from schema version %d to %d", self.path, version, version + 1)
                    _MIGRATIONS[version](db)
                    version += 1
                db.execute(_ENTRIES_KEY)
            for statement in _TABLES:
                db.execute(statement)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _schema_version(self) -> int | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table: a new database
            return None
        return int(row[0]) if row else None

    # ------------------------------------------------------------------------ SqlCache
    def _execute(self, sql: str, parameters: Iterable[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, tuple(parameters))

    def _transaction(self) -> contextlib.AbstractContextManager:
        return _transaction(self._db)

    def _write_entries(self, entries: list[Entry]) -> int:
        return _write_entries(self._db, entries)

    def get(self, category: str, tool: str, api: str, arguments: str, identity: str = RECORDED,
            history: str = NO_SESSION, count_hit: bool = True) -> tuple[str, str] | None:
        if history:
            rows = self._db.execute(_FIND_IN_SESSION, (category, tool, api, arguments, history)).fetchall()
        else:
            rows = self._db.execute(_FIND, (category, tool, api, arguments)).fetchall()
        return self._served(rows, identity, history, count_hit)

    def stats(self) -> dict:
        stats = super().stats()
        stats["path"] = stats["location"]
        stats["bytes"] = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file())
        return stats

    def checkpoint(self) -> None:
        """Copy the WAL into the database file on a connection of its own, so that it may run in
        another thread: a checkpoint syncs the disk and takes tens of milliseconds. A WAL grown past
        WAL_LIMIT_BYTES is truncated whole (TRUNCATE waits, at most the busy timeout, for readers of older
        snapshots; the server's writer meanwhile retries its commits, losing nothing)."""
        db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        try:
            db.execute(f"PRAGMA journal_size_limit={int(WAL_LIMIT_BYTES)}")
            wal = self.path.with_name(self.path.name + "-wal")
            large = wal.exists() and wal.stat().st_size > WAL_LIMIT_BYTES
            db.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if large else 'PASSIVE'})")
        finally:
            db.close()

    def close(self) -> None:
        try:
            self.flush_hits()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._db.close()

    # ------------------------------------------------------------------------ the request path
    # Called on the server's event loop only.
    async def lookup(self, call: Call, identity: str) -> tuple[bytes, str] | None:
        """(observation JSON as bytes, provenance) a server of `identity` answers `call` with, or None; counts
        the hit."""
        if call.history:
            rows = self._db.execute(_LOOKUP_IN_SESSION, (call.category, call.tool, call.api, call.arguments,
                                                         call.history)).fetchall()
        else:
            rows = self._db.execute(_LOOKUP, (call.category, call.tool, call.api, call.arguments)).fetchall()
        return self._served(rows, identity, call.history, True)

    async def store(self, entry: Entry, lease_holder: str | None = None) -> bool:
        """Store an answer (and give up the lease `lease_holder` took on its call); returns once committed."""
        def job(db: sqlite3.Connection) -> bool:
            stored = _write_entries(db, (entry,)) == 1
            if lease_holder is not None:
                db.execute(_RELEASE_LEASE, (*_key(entry.call), entry.identity, lease_holder))
            return stored
        return await self._loop_writer().submit(job)

    async def recorded_examples(self, category: str, tool: str, api: str, limit: int) -> list[tuple[str, str]]:
        return self.examples(category, tool, api, limit)

    async def try_lease(self, call: Call, identity: str, holder: str, seconds: float) -> bool:
        """Whether `holder` may simulate `call` now: nobody else holds an unexpired lease on it (then it holds one)."""
        now = time.time()
        return await self._loop_writer().submit(
            lambda db: db.execute(_TAKE_LEASE, (*_key(call), identity, holder, now + seconds, now)).rowcount == 1)

    async def release_lease(self, call: Call, identity: str, holder: str) -> None:
        await self._loop_writer().submit(lambda db: db.execute(_RELEASE_LEASE, (*_key(call), identity, holder)))

    async def session(self, session_id: str, idle_seconds: float) -> tuple[str, int, list[str]] | None:
        """(digest, steps, kept lines) of a session used within `idle_seconds`, else None."""
        row = self._db.execute("SELECT digest, steps, lines FROM sessions WHERE id = ? AND used >= ?",
                               (session_id, time.time() - idle_seconds)).fetchone()
        return (row[0], row[1], json.loads(row[2])) if row else None

    async def update_session(self, session_id: str, idle_seconds: float,
                             advance: Callable[[tuple[str, int, list[str]] | None], tuple[str, int, list[str]]]
                             ) -> tuple[str, int, list[str]]:
        """Apply `advance` to the session's state (None: new or expired) in one transaction; the new state."""
        def job(db: sqlite3.Connection) -> tuple[str, int, list[str]]:
            now = time.time()
            row = db.execute("SELECT digest, steps, lines FROM sessions WHERE id = ? AND used >= ?",
                             (session_id, now - idle_seconds)).fetchone()
            state = advance((row[0], row[1], json.loads(row[2])) if row else None)
            db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?)",
                       (session_id, state[0], state[1], json.dumps(state[2], ensure_ascii=False), now))
            return state
        return await self._loop_writer().submit(job)

    async def maintain(self, idle_seconds: float) -> None:
        """Write the counted hits (in slices), forget sessions idle longer than `idle_seconds` and expired
        leases, then checkpoint the WAL in a thread."""
        writer = self._loop_writer()
        hits, self._pending_hits = self._pending_hits, {}
        ids = sorted(hits)  # in the order of the table: the pages are written once each
        for start in range(0, len(ids), HIT_FLUSH_ROWS):
            rows = [(hits[id_], id_) for id_ in ids[start:start + HIT_FLUSH_ROWS]]
            await writer.submit(functools.partial(_count_hits, rows=rows))
        now = time.time()
        await writer.submit(lambda db: (
            db.execute("DELETE FROM sessions WHERE id IN (SELECT id FROM sessions WHERE used < ? LIMIT 1000)",
                       (now - idle_seconds,)),
            db.execute("DELETE FROM leases WHERE expires < ?", (now,))))
        with contextlib.suppress(sqlite3.Error):  # reported by `_checkpointed`; next time
            await asyncio.shield(self._start_checkpoint())

    async def aclose(self) -> None:
        """Write everything handed over and the counted hits, then close."""
        if self._writer is not None:
            await self.maintain(idle_seconds=float("inf"))
            await self._writer.drain()
            if self._checkpointing is not None:  # one the last commits started
                with contextlib.suppress(sqlite3.Error):
                    await self._checkpointing
        self.close()

    def _loop_writer(self) -> LoopWriter:
        if self._writer is None:
            db = _connect(self.path, busy_timeout=0.0)
            committed = None
            if not self._autocheckpoint:
                # The writes are committed on the event loop: a checkpoint there (SQLite runs one in the commit
                # that grows the WAL past 1,000 pages) copies and syncs megabytes while every request waits.
                # Measured, 3,000 commits of one simulated answer each: 10 took 5-17 ms (107 ms in all) with
                # SQLite's checkpoints, 1 (7 ms) without. A thread checkpoints instead, every CHECKPOINT_WRITES
                # commits (the WAL stays about as small as SQLite's own rule keeps it) and at each `maintain()`.
                db.execute("PRAGMA wal_autocheckpoint=0")
                committed = self._committed
            self._writer = LoopWriter(db, committed)
        return self._writer

    def _committed(self) -> None:
        self._commits += 1
        if self._commits >= CHECKPOINT_WRITES and self._checkpointing is None:
            self._start_checkpoint()

    def _start_checkpoint(self) -> asyncio.Future:
        """A checkpoint in a thread, unless one is running already (then that one)."""
        if self._checkpointing is None:
            self._commits = 0
            self._checkpointing = asyncio.get_running_loop().run_in_executor(None, self.checkpoint)
            self._checkpointing.add_done_callback(self._checkpointed)
        return self._checkpointing

    def _checkpointed(self, done: asyncio.Future) -> None:
        self._checkpointing = None
        if not done.cancelled() and done.exception() is not None:  # e.g. another process holds the database
            logger.warning("cache checkpoint postponed: %s", done.exception())


def _key(call: Call) -> tuple[str, str, str, str, str]:
    return call.category, call.tool, call.api, call.arguments, call.history


def _count_hits(db: sqlite3.Connection, rows: list[tuple[int, int]]) -> None:
    db.executemany(_COUNT_HITS, rows)
