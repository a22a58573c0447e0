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

The schema and its migrations are `sqlite_schema`; the server's writer is `sqlite_writer`. Every statement is
SQLite's own (`?` parameters), the administrative ones in `STATEMENTS` (see `store.Store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mirrorapi.serving.cache.entries import ENTRY_COLUMNS, NO_SESSION, RECORDED, CacheError, Call, Entry
from mirrorapi.serving.cache.sqlite_schema import open_schema
from mirrorapi.serving.cache.sqlite_writer import LoopWriter
from mirrorapi.serving.cache.store import (
    FORGET_SESSIONS_BATCH,
    FORGET_SESSIONS_BATCHES,
    HIT_FLUSH_ROWS,
    IMPORT_TRANSACTION_ROWS,
    Advance,
    Session,
    SessionState,
    Statements,
    Store,
)

logger = logging.getLogger(__name__)

# How long a request waits for its write while another connection holds the database lock (then it goes on, the
# write queued: `ResponseCache._written`); the writer gets in between an import's transactions within milliseconds.
WRITE_WAIT_SECONDS = 10.0
CHECKPOINT_WRITES = 250  # writer commits between checkpoints (in a thread) of a server's cache
# The WAL file's bound: SQLite truncates it to this size whenever a checkpoint starts it over
# (journal_size_limit), and a server's maintenance truncates it whole (a TRUNCATE checkpoint) when it is found
# larger. Without it the file keeps its largest size for ever: 6.77 GB after a burst of big session writes.
WAL_LIMIT_BYTES = 64 * 1024 * 1024

_COLUMNS = ", ".join(ENTRY_COLUMNS)
_INSERT = (
    f"INSERT OR IGNORE INTO entries ({_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
)
# A simulated answer is not stored where a recorded one exists (it would never be served)...
_INSERT_SIMULATED = (
    f"INSERT OR IGNORE INTO entries ({_COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
    "?11, ?12, ?13, ?14 WHERE NOT EXISTS (SELECT 1 FROM entries WHERE category = ?1 AND tool = ?2 AND "
    "api = ?3 AND arguments = ?4 AND history = '' AND identity = '')"
)
# ... and a recorded answer replaces every simulated answer of the same call. The first recording stays.
_DROP_SHADOWED = "DELETE FROM entries WHERE category = ? AND tool = ? AND api = ? AND arguments = ? AND identity != ''"
# Equality on the key's prefix: the recorded row or the simulated rows of each identity (a few at most).
# The request path reads the observation as bytes: it is the response body as stored (no decode, no encode).
_SELECT = (
    "SELECT id, {}, provenance, identity, history FROM entries WHERE category = ? AND tool = ? AND api = ? "
    "AND arguments = ? AND "
)
_FIND = _SELECT.format("observation") + "history = ''"
_FIND_IN_SESSION = _SELECT.format("observation") + "history IN ('', ?)"
_LOOKUP = _SELECT.format("CAST(observation AS BLOB)") + "history = ''"
_LOOKUP_IN_SESSION = _SELECT.format("CAST(observation AS BLOB)") + "history IN ('', ?)"
_COUNT_HITS = "UPDATE entries SET hits = hits + ? WHERE id = ?"
_TAKE_LEASE = (
    "INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET holder = excluded.holder, "
    "expires = excluded.expires WHERE leases.expires < ? OR leases.holder = excluded.holder"
)
_RELEASE_LEASE = (
    "DELETE FROM leases WHERE category = ? AND tool = ? AND api = ? AND arguments = ? AND history = ? "
    "AND identity = ? AND holder = ?"
)
_SESSION = "SELECT digest, steps, lines FROM sessions WHERE id = ? AND used >= ?"
_PUT_SESSION = "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?)"
_NEW_SESSION = "INSERT INTO sessions VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
_FORGET_SESSIONS = "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions WHERE used < ? LIMIT ?)"
_FORGET_LEASES = "DELETE FROM leases WHERE expires < ?"
# The administrative side's statements (`store.Store`).
STATEMENTS = Statements(
    count_hits=_COUNT_HITS,
    prune="DELETE FROM entries WHERE identity = ?",
    forget_import="DELETE FROM imports WHERE origin = ?",
    record_import="INSERT INTO imports VALUES (?, ?, ?, ?)",
    examples="SELECT arguments, observation FROM entries WHERE category = ? AND tool = ? AND api = ? "
    "AND identity = '' ORDER BY arguments LIMIT ?",
    entries="SELECT category, tool, api, arguments, observation, provenance FROM entries WHERE history = ''{where} "
    "ORDER BY category, tool, api, arguments, identity",
    # Within an API, calls in the order they were first stored (an imported StableToolBench file's own order: its
    # GPT server shows a file's first entries as examples), a call's recorded answer after its simulated ones.
    served_entries="SELECT category, tool, api, arguments_as_sent, observation FROM entries WHERE history = '' AND "
    "identity IN ('', ?){where} ORDER BY category, tool, api, "
    "min(id) OVER (PARTITION BY category, tool, api, arguments), identity DESC",
    provenance_prefix="substr(provenance, 1, length(?)) = ?",
    rows=f"SELECT {_COLUMNS} FROM entries",
    sessions="SELECT id, digest, steps, lines, used FROM sessions",
    imports="SELECT origin, fingerprint, entries, imported_at FROM imports ORDER BY imported_at",
    identities=(
        "SELECT identity, count(*) FROM entries WHERE identity != '' AND history = '' "
        "GROUP BY identity ORDER BY identity"
    ),
    import_fingerprint="SELECT fingerprint FROM imports WHERE origin = ?",
    count="SELECT count(*) FROM entries",
    open_sessions="SELECT count(*) FROM sessions WHERE used >= ?",
    session_count="SELECT count(*) FROM entries WHERE history != ''",
    stats_by_provenance="SELECT provenance, count(*) FROM entries GROUP BY provenance",
    stats_by_identity="SELECT identity, count(*), sum(hits), min(created), max(created) FROM entries "
    "WHERE identity != '' GROUP BY identity ORDER BY identity",
    stats_totals="SELECT count(*), coalesce(sum(hits), 0), count(DISTINCT category || '/' || tool || '/' || api), "
    "sum(CASE WHEN error != '' THEN 1 ELSE 0 END), sum(CASE WHEN identity = '' THEN 1 ELSE 0 END), "
    "sum(CASE WHEN history != '' THEN 1 ELSE 0 END) FROM entries",
    stats_imports="SELECT origin, entries, imported_at FROM imports ORDER BY imported_at",
    stats_sessions="SELECT count(*) FROM sessions",
)


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
        row = entry.values()
        if entry.identity:  # simulated
            stored += db.execute(_INSERT_SIMULATED, row).rowcount
        else:
            inserted = db.execute(_INSERT, row).rowcount
            if inserted:
                db.execute(_DROP_SHADOWED, row[:4])
            stored += inserted
    return stored


class ResponseCache(Store):
    """The cache in the SQLite file `path` (see the module doc). `autocheckpoint=False`: the owner calls
    `maintain()`, which checkpoints in a thread (a checkpoint syncs the disk)."""

    sql = STATEMENTS

    def __init__(self, path: str | os.PathLike, busy_timeout: float = 10.0, autocheckpoint: bool = True):
        self.path = Path(path)
        self.location = str(self.path)
        self._busy_timeout = busy_timeout
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
            open_schema(self._db, self.path, self._transaction)
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(f"cannot open cache database {self.path}: {exc}") from None

    # ------------------------------------------------------------------------ Store
    def _execute(self, sql: str, parameters: Iterable[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, tuple(parameters))

    def _transaction(self) -> contextlib.AbstractContextManager:
        return _transaction(self._db)

    def _write_entries(self, entries: list[Entry]) -> int:
        return _write_entries(self._db, entries)

    def put_sessions(self, sessions: Iterable[Session]) -> int:
        stored, sessions = 0, iter(sessions)
        while chunk := list(itertools.islice(sessions, IMPORT_TRANSACTION_ROWS)):
            with self._transaction():
                stored += sum(self._db.execute(_NEW_SESSION, row).rowcount for row in chunk)
        return stored

    def get(
        self,
        category: str,
        tool: str,
        api: str,
        arguments: str,
        identity: str = RECORDED,
        history: str = NO_SESSION,
        count_hit: bool = True,
    ) -> tuple[str, str] | None:
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
    async def lookup(self, call: Call, identity: str, count_hit: bool = True) -> tuple[bytes, str] | None:
        if call.history:
            rows = self._db.execute(
                _LOOKUP_IN_SESSION, (call.category, call.tool, call.api, call.arguments, call.history)
            ).fetchall()
        else:
            rows = self._db.execute(_LOOKUP, (call.category, call.tool, call.api, call.arguments)).fetchall()
        return self._served(rows, identity, call.history, count_hit)

    async def store(self, entry: Entry, lease_holder: str | None = None) -> bool:
        def job(db: sqlite3.Connection) -> bool:
            stored = _write_entries(db, (entry,)) == 1
            if lease_holder is not None:
                db.execute(_RELEASE_LEASE, (*_key(entry.call), entry.identity, lease_holder))
            return stored

        return await self._written(self._loop_writer().submit(job))

    async def _written(self, write: asyncio.Future) -> Any:
        """What a request's write returns once committed; CacheError when another connection has held the database
        lock for WRITE_WAIT_SECONDS (an import's transaction, a `sqlite3` shell left open): the write stays queued
        and commits once the lock is free, and the request goes on without waiting for it, as it does when a
        PostgreSQL store is away (the answer given unstored, the session not advanced yet). It waited for ever."""
        write.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved: no stray warning
        try:
            return await asyncio.wait_for(asyncio.shield(write), WRITE_WAIT_SECONDS)
        except asyncio.TimeoutError:
            raise CacheError(
                f"cache database {self.path}: another connection has held its lock for {WRITE_WAIT_SECONDS:g} s; "
                "the write is queued and commits once the lock is free"
            ) from None

    async def recorded_examples(self, category: str, tool: str, api: str, limit: int) -> list[tuple[str, str]]:
        return self.examples(category, tool, api, limit)

    async def health_counts(self, idle_seconds: float) -> tuple[int, int, int]:
        """The base class's counts on a connection of their own, in a thread: each scans an index, and on a file of
        a million session answers the three take ~0.25 s, which on the loop held every request back. With /health
        probed each second beside 8 clients of cache hits, a hit's worst latency was 246-258 ms counted on the loop,
        13.5-14.8 ms in a thread (p99 6 and 9 ms; 2 runs each, interleaved, 2026-11-30, the audit's script). sqlite3
        lets the GIL go while it reads."""
        return await asyncio.to_thread(self._counts_apart, time.time() - idle_seconds)

    def _counts_apart(self, since: float) -> tuple[int, int, int]:
        db = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        try:
            return (
                db.execute(self.sql.count).fetchone()[0],
                db.execute(self.sql.open_sessions, (since,)).fetchone()[0],
                db.execute(self.sql.session_count).fetchone()[0],
            )
        except sqlite3.Error as exc:
            raise CacheError(f"cannot count the entries of {self.location}: {exc}") from exc
        finally:
            db.close()

    async def try_lease(self, call: Call, identity: str, holder: str, seconds: float) -> bool:
        now = time.time()
        return await self._loop_writer().submit(
            lambda db: db.execute(_TAKE_LEASE, (*_key(call), identity, holder, now + seconds, now)).rowcount == 1
        )

    async def release_lease(self, call: Call, identity: str, holder: str) -> None:
        release = self._loop_writer().submit(lambda db: db.execute(_RELEASE_LEASE, (*_key(call), identity, holder)))
        await self._written(release)

    async def session(self, session_id: str, idle_seconds: float) -> SessionState | None:
        row = self._db.execute(_SESSION, (session_id, time.time() - idle_seconds)).fetchone()
        return (row[0], row[1], json.loads(row[2])) if row else None

    async def update_session(self, session_id: str, idle_seconds: float, advance: Advance) -> SessionState:
        def job(db: sqlite3.Connection) -> SessionState:
            now = time.time()
            row = db.execute(_SESSION, (session_id, now - idle_seconds)).fetchone()
            state = advance((row[0], row[1], json.loads(row[2])) if row else None)
            db.execute(_PUT_SESSION, (session_id, state[0], state[1], json.dumps(state[2], ensure_ascii=False), now))
            return state

        return await self._written(self._loop_writer().submit(job))

    async def maintain(self, idle_seconds: float) -> None:
        """Hits are written in slices; then the WAL is checkpointed in a thread."""
        writer = self._loop_writer()
        hits, self._pending_hits = self._pending_hits, {}
        ids = sorted(hits)  # in the order of the table: the pages are written once each
        for start in range(0, len(ids), HIT_FLUSH_ROWS):
            rows = [(hits[id_], id_) for id_ in ids[start : start + HIT_FLUSH_ROWS]]
            await writer.submit(functools.partial(_count_hits, rows=rows))
        now = time.time()
        for _ in range(FORGET_SESSIONS_BATCHES):  # a job each: requests' writes go between them
            forgotten = await writer.submit(
                lambda db: db.execute(_FORGET_SESSIONS, (now - idle_seconds, FORGET_SESSIONS_BATCH)).rowcount
            )
            if forgotten < FORGET_SESSIONS_BATCH:
                break
        await writer.submit(lambda db: db.execute(_FORGET_LEASES, (now,)))
        with contextlib.suppress(sqlite3.Error):  # reported by `_checkpointed`; next time
            await asyncio.shield(self._start_checkpoint())

    async def aclose(self) -> None:
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
