"""Response cache keys, the `ResponseCache` the server answers from, and its StableToolBench import/export.

One key function for the whole project: the canonical JSON of the arguments (sorted keys, compact,
UTF-8). The data builder deduplicates with it and the cache stores with it, so a call seen in
training and a call seen by the server are the same call. Next to the key, each entry keeps the
arguments as first received (key order included): StableToolBench looks calls up by
`str(json.loads(tool_input))`, in the order the agent sent them, so that is the order an export writes.

Recorded answers (provenance `real`, `imported:<origin>`) are shared by every simulator. A simulated
answer belongs to the *simulator identity* that produced it (model, prompt format and the decoding
settings that change answers, see `mirrorapi.serving.simulator.simulator_identity`); a lookup under
one identity never returns another identity's simulated answer.

StableToolBench's cache folder layout (notes §3) is `<cache>/<category>/<tool>_for_<category>/<api>.json`,
each file an object mapping the Python repr of an argument dict to `{"error", "response"}`.
`import_stabletoolbench_cache` reads it (repr keys map to canonical keys), `export_stabletoolbench_cache`
writes it back; `import_pairs` loads real pairs (our JSONL schema) with provenance `real`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.records import (
    SourceError,
    canonical_json,
    observation_json,
    read_pairs_jsonl,
    read_stabletoolbench_cache,
)
from mirrorapi.tools import ToolRegistry, UnknownName

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- schema
# Version 2 (this one). To extend the key (e.g. session-history keyed entries), add a column to
# `entries` and to its primary key, bump SCHEMA_VERSION and add a step to `_MIGRATIONS` that
# rebuilds the table from the previous version (an old database must open and keep its entries).
SCHEMA_VERSION = 2
REAL = "real"
IMPORTED = "imported:"  # + origin (the folder or file name the entries came from)
SIMULATED = "simulated:"  # + the simulator identity
RECORDED = ""  # the `identity` of recorded entries (real, imported:*): shared by every simulator

_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_ENTRIES = """
CREATE TABLE {name} (
    category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL,
    arguments TEXT NOT NULL,              -- canonical_json of the argument object: the (order-insensitive) key
    identity TEXT NOT NULL,               -- '' for recorded answers; the simulator identity for simulated ones
    arguments_as_sent TEXT NOT NULL,      -- the same arguments as first received, key order kept (export order)
    error TEXT NOT NULL,
    observation TEXT NOT NULL,            -- the whole {{"error", "response"}} answer, compact JSON
    provenance TEXT NOT NULL,             -- real | imported:<origin> | simulated:<identity>
    created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (category, tool, api, arguments, identity)) WITHOUT ROWID
"""
_IMPORTS = ("CREATE TABLE IF NOT EXISTS imports (origin TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
            "entries INTEGER NOT NULL, imported_at REAL NOT NULL)")


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Version 1 had one entry per call. Recorded entries become shared ones; a simulated entry keeps
    the identity its provenance names (`<model>@<prompt format>`, decoding settings unknown), so it
    is kept, counted, exported and pruned under that name, but served only by a server told to serve
    exactly that identity (`simulator_identity`). Arguments as first received were not kept: the
    canonical (sorted) form stands in for them."""
    db.execute(_ENTRIES.format(name="entries_v2"))
    db.execute("INSERT INTO entries_v2 SELECT category, tool, api, arguments, CASE WHEN provenance LIKE "
               f"'{SIMULATED}%' THEN substr(provenance, {len(SIMULATED) + 1}) ELSE '' END, arguments, error, "
               "observation, provenance, created, hits FROM entries")
    db.execute("DROP TABLE entries")
    db.execute("ALTER TABLE entries_v2 RENAME TO entries")


_MIGRATIONS = {1: _migrate_1_to_2}  # version n -> n + 1, run in one transaction at open

_INSERT = ("INSERT OR IGNORE INTO entries (category, tool, api, arguments, identity, arguments_as_sent, error, "
           "observation, provenance, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
# A simulated answer is not stored where a recorded one exists (it would never be served)...
_INSERT_SIMULATED = (_INSERT.replace("VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? ")
                     + "WHERE NOT EXISTS (SELECT 1 FROM entries WHERE category = ?1 AND tool = ?2 AND api = ?3 "
                     "AND arguments = ?4 AND identity = '')")
# ... and a recorded answer replaces every simulated answer of the same call. The first recording stays.
_DROP_SHADOWED = "DELETE FROM entries WHERE category = ? AND tool = ? AND api = ? AND arguments = ? AND identity != ''"
# At most one row matches: a call has a recorded answer or simulated ones, never both (no ORDER BY:
# it cost a hit a fifth more time in SQLite).
_LOOKUP = ("SELECT observation, provenance, identity FROM entries WHERE category = ? AND tool = ? AND api = ? "
           "AND arguments = ? AND identity IN ('', ?)")
_COUNT_HITS = ("UPDATE entries SET hits = hits + ? WHERE category = ? AND tool = ? AND api = ? AND arguments = ? "
               "AND identity = ?")
IMPORT_TRANSACTION_ROWS = 200  # rows per import transaction (a few ms): a server's writes wait for one slice
IMPORT_PAUSE_SECONDS = 0.002  # between slices, so that a waiting writer gets the lock (SQLite's is not fair)


def identity_of(provenance: str) -> str:
    """The `identity` column of an entry of this provenance ('' for recorded answers)."""
    return provenance[len(SIMULATED):] if provenance.startswith(SIMULATED) else RECORDED


def _entry_row(category: str, tool: str, api: str, arguments: Any, error: str, response: Any,
               provenance: str, now: float) -> tuple:
    """`arguments`: the argument object, or its JSON text; either way its key order is kept as given."""
    as_sent = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False,
                                                                       separators=(",", ":"))
    key = canonical_json(json.loads(as_sent) if isinstance(arguments, str) else arguments)
    return (category, tool, api, key, identity_of(provenance), as_sent, error, observation_json(error, response),
            provenance, now)


# Answers simulated inside a session (issue 13) depend on the session's earlier calls, so they live
# in a table of their own, keyed by the call and by a digest of the session's history so far; the
# stateless `entries` never hold one. A session call still takes a recorded entry of `entries` first.
# Like simulated entries, they belong to the simulator identity that produced them. A new table in a
# database of any version: created at open when missing, so no migration is needed.
_SESSION_ENTRIES = """
CREATE TABLE IF NOT EXISTS session_entries (
    category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL,
    arguments TEXT NOT NULL,              -- canonical_json of the argument object
    identity TEXT NOT NULL,               -- the simulator identity (session format) that answered
    history TEXT NOT NULL,                -- digest of the session's earlier calls and answers (serving.sessions)
    steps INTEGER NOT NULL,               -- how many earlier calls that history holds
    error TEXT NOT NULL, observation TEXT NOT NULL,
    provenance TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (category, tool, api, arguments, identity, history)) WITHOUT ROWID
"""
_INSERT_SESSION = "INSERT OR IGNORE INTO session_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


class _SessionRow(tuple):
    """A session_entries row on its way to the writer thread (other rows are `entries` rows)."""


class CacheError(Exception):
    """The cache database or a folder to import cannot be used; the message says which and why."""


# ------------------------------------------------------------------------------- ResponseCache
class ResponseCache:
    """Responses keyed by (category, tool, api, canonical arguments, identity), on SQLite in WAL mode.

    Every `put` is its own committed transaction, so a process killed at any moment leaves a
    database that opens with every entry committed before (WAL replays on open). Several processes
    may share the file (WAL readers never block; writers wait up to `busy_timeout` seconds).
    Hit counts are kept in memory and written by `flush_hits()` (the server flushes every few
    seconds and at shutdown), so a cache hit costs one indexed read and no write.

    A server calls `start_writer()`: from then on `store` and `flush_hits` hand their writes to one
    writer thread with a connection of its own, so the event loop never waits for SQLite's write
    lock (another process importing, a checkpoint); see `_Writer`.
    """

    def __init__(self, path: str | os.PathLike, busy_timeout: float = 10.0, autocheckpoint: bool = True):
        self.path = Path(path)
        self._pending_hits: dict[tuple[str, str, str, str, str], int] = {}
        self._writer: _Writer | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = _connect(self.path, busy_timeout)
            if not autocheckpoint:  # the owner calls `checkpoint()` off the request path (see the server)
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._open_schema()
            self._db.execute(_SESSION_ENTRIES)
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
            elif version > SCHEMA_VERSION:
                raise CacheError(f"{self.path}: cache schema version {version} was written by a newer mirrorapi; "
                                 f"this one reads versions up to {SCHEMA_VERSION}")
            else:
                while version < SCHEMA_VERSION:
                    logger.info("migrating cache %s from schema version %d to %d", self.path, version, version + 1)
                    _MIGRATIONS[version](db)
                    version += 1
            db.execute(_IMPORTS)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _schema_version(self) -> int | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table: a new database
            return None
        return int(row[0]) if row else None

    # ------------------------------------------------------------------------ read and write
    def get(self, category: str, tool: str, api: str, arguments: str, identity: str = RECORDED,
            count_hit: bool = True) -> tuple[str, str] | None:
        """(observation JSON, provenance) for canonical `arguments`: the recorded answer, else the
        simulated answer of `identity` (never another identity's), else None."""
        row = self._db.execute(_LOOKUP, (category, tool, api, arguments, identity)).fetchone()
        if row is None:
            return None
        if count_hit:
            key = (category, tool, api, arguments, row[2])
            self._pending_hits[key] = self._pending_hits.get(key, 0) + 1
        return row[0], row[1]

    def put(self, category: str, tool: str, api: str, arguments: Any, error: str, response: Any,
            provenance: str) -> bool:
        """Store one answer (committed on return); False when an entry that wins is already there.
        `arguments`: the argument object (or its JSON text) as received; its key order is kept."""
        with self._transaction():
            return _write_entries(self._db, [_entry_row(category, tool, api, arguments, error, response,
                                                        provenance, time.time())]) == 1

    async def store(self, category: str, tool: str, api: str, arguments: Any, error: str, response: Any,
                    provenance: str) -> bool:
        """`put` for the event loop: through the writer thread when started (the loop goes on
        serving while SQLite waits); returns once the answer is committed."""
        row = _entry_row(category, tool, api, arguments, error, response, provenance, time.time())
        if self._writer is None:
            with self._transaction():
                return _write_entries(self._db, [row]) == 1
        return await asyncio.wrap_future(self._writer.submit(row))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with _transaction(self._db):
            yield

    def put_many(self, rows: Iterable[tuple[str, str, str, Any, str, Any]], provenance: str) -> int:
        """Store (category, tool, api, arguments, error, response) rows; returns how many were new.
        Committed in slices of IMPORT_TRANSACTION_ROWS, so that a server sharing the file never
        waits long for the write lock (an interrupted import is simply run again: nothing doubles)."""
        now, stored, first = time.time(), 0, True
        rows = iter(rows)
        while chunk := [_entry_row(c, t, a, args, e, r, provenance, now)
                        for c, t, a, args, e, r in itertools.islice(rows, IMPORT_TRANSACTION_ROWS)]:
            if not first:
                time.sleep(IMPORT_PAUSE_SECONDS)
            first = False
            with self._transaction():
                stored += _write_entries(self._db, chunk)
        return stored

    def examples(self, category: str, tool: str, api: str, limit: int = 256) -> list[tuple[str, str]]:
        """(arguments, observation) of recorded entries (real or imported, never simulated) of one API."""
        return self._db.execute(
            "SELECT arguments, observation FROM entries WHERE category = ? AND tool = ? AND api = ? "
            "AND identity = '' ORDER BY arguments LIMIT ?", (category, tool, api, limit)).fetchall()

    def entries(self, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments, observation, provenance) in key order; `provenance`: prefixes to keep."""
        prefixes = list(provenance)
        where = " OR ".join("provenance LIKE ?" for _ in prefixes) or "1"
        return self._db.execute(f"SELECT category, tool, api, arguments, observation, provenance FROM entries "
                                f"WHERE {where} ORDER BY category, tool, api, arguments, identity",
                                [p + "%" for p in prefixes])

    def served_entries(self, identity: str, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments as first received, observation) of every call a server of
        `identity` answers from the cache, in key order; `provenance`: prefixes to keep. A call has a
        recorded answer or simulated ones, never both (see `_write_entries`): one row per call."""
        prefixes = list(provenance)
        where = "".join(" AND (" + " OR ".join("provenance LIKE ?" for _ in prefixes) + ")" for _ in prefixes[:1])
        return self._db.execute(
            f"SELECT category, tool, api, arguments_as_sent, observation FROM entries WHERE identity IN ('', ?)"
            f"{where} ORDER BY category, tool, api, arguments", [identity] + [p + "%" for p in prefixes])

    def identities(self) -> dict[str, int]:
        """Simulated entries per simulator identity."""
        return dict(self._db.execute("SELECT identity, count(*) FROM entries WHERE identity != '' "
                                     "GROUP BY identity ORDER BY identity"))

    def prune(self, identity: str) -> int:
        """Delete the simulated answers of one simulator identity (session-scoped ones included);
        returns how many."""
        if not identity:
            raise CacheError("prune takes a simulator identity; recorded answers are never pruned")
        with self._transaction():
            return (self._db.execute("DELETE FROM entries WHERE identity = ?", (identity,)).rowcount
                    + self._db.execute("DELETE FROM session_entries WHERE identity = ?", (identity,)).rowcount)

    def start_writer(self) -> None:
        """Send `store`s and hit flushes through one writer thread from now on (see the class doc)."""
        if self._writer is None:
            self._writer = _Writer(self.path)

    def flush_hits(self, limit: int | None = None) -> int:
        """Write counted hits (at most `limit` entries' worth); returns how many entries are still pending.
        With the writer started, all of them are handed to it (no waiting here) and 0 is returned."""
        if not self._pending_hits:
            return 0
        if self._writer is not None:
            hits, self._pending_hits = self._pending_hits, {}
            self._writer.submit_hits(hits)
            return 0
        keys = list(itertools.islice(self._pending_hits, limit)) if limit else list(self._pending_hits)
        with self._transaction():
            self._db.executemany(_COUNT_HITS, ((self._pending_hits[key], *key) for key in keys))
        for key in keys:  # forgotten only once written
            del self._pending_hits[key]
        return len(self._pending_hits)

    def checkpoint(self) -> None:
        """Copy the WAL into the database file on a connection of its own, so that it may run in
        another thread: a checkpoint syncs the disk and takes tens of milliseconds."""
        db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    # ------------------------------------------------------------------------ session-scoped entries
    def get_in_session(self, category: str, tool: str, api: str, arguments: str, identity: str,
                       history: str) -> tuple[str, str] | None:
        """(observation JSON, provenance) that simulator `identity` gave the call after the session
        history `history`, or None. (Recorded answers are looked up with `get`, and win.)"""
        return self._db.execute("SELECT observation, provenance FROM session_entries WHERE category = ? AND tool = ? "
                                "AND api = ? AND arguments = ? AND identity = ? AND history = ?",
                                (category, tool, api, arguments, identity, history)).fetchone()

    async def store_in_session(self, category: str, tool: str, api: str, arguments: str, identity: str,
                               history: str, steps: int, error: str, response: Any, provenance: str) -> bool:
        """Store the answer of a call after `history` (through the writer thread when started); the
        first answer stays. Returns once committed."""
        row = _SessionRow((category, tool, api, arguments, identity, history, steps, error,
                           observation_json(error, response), provenance, time.time()))
        if self._writer is None:
            with self._transaction():
                return self._db.execute(_INSERT_SESSION, row).rowcount == 1
        return await asyncio.wrap_future(self._writer.submit(row))

    def session_count(self) -> int:
        return self._db.execute("SELECT count(*) FROM session_entries").fetchone()[0]

    # ------------------------------------------------------------------------ imports and stats
    def import_fingerprint(self, origin: str) -> str | None:
        row = self._db.execute("SELECT fingerprint FROM imports WHERE origin = ?", (origin,)).fetchone()
        return row[0] if row else None

    def record_import(self, origin: str, fingerprint: str, entries: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO imports VALUES (?, ?, ?, ?)", (origin, fingerprint, entries, time.time()))

    def count(self) -> int:
        return self._db.execute("SELECT count(*) FROM entries").fetchone()[0]

    def stats(self) -> dict:
        by_provenance = dict(self._db.execute("SELECT provenance, count(*) FROM entries GROUP BY provenance"))
        by_identity = {identity: {"entries": n, "hits": hits, "first": first, "last": last}
                       for identity, n, hits, first, last in self._db.execute(
                           "SELECT identity, count(*), sum(hits), min(created), max(created) FROM entries "
                           "WHERE identity != '' GROUP BY identity ORDER BY identity")}
        totals = self._db.execute("SELECT count(*), coalesce(sum(hits), 0), count(DISTINCT category || '/' || tool "
                                  "|| '/' || api), sum(error != ''), sum(identity = '') FROM entries").fetchone()
        imports = [{"origin": o, "entries": n, "imported_at": t} for o, n, t in
                   self._db.execute("SELECT origin, entries, imported_at FROM imports ORDER BY imported_at")]
        return {"path": str(self.path), "schema_version": SCHEMA_VERSION, "entries": totals[0], "apis": totals[2],
                "errors": totals[3] or 0, "hits": totals[1], "recorded": totals[4] or 0,
                "by_identity": by_identity, "by_provenance": by_provenance, "imports": imports,
                "session_entries": self.session_count(),
                "bytes": sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file())}

    def close(self) -> None:
        try:
            self.flush_hits()
            if self._writer is not None:
                self._writer.close()  # writes everything handed to it, then stops
                self._writer = None
        finally:
            self._db.close()


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    # isolation_level=None: autocommit, each statement (or explicit BEGIN block) one transaction.
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes in WAL mode
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


def _write_entries(db: sqlite3.Connection, rows: list[tuple]) -> int:
    """Insert entry rows (inside a transaction) by the rules above; returns how many were stored."""
    stored = 0
    for row in rows:
        if row[4]:  # simulated
            stored += db.execute(_INSERT_SIMULATED, row).rowcount
        else:
            inserted = db.execute(_INSERT, row).rowcount
            if inserted:
                db.execute(_DROP_SHADOWED, row[:4])
            stored += inserted
    return stored


class _Writer:
    """One thread, one connection, one queue: every write of a server's cache.

    Why a thread: SQLite's write lock can be held by another process for as long as it likes (a
    `mirrorapi cache import`, an older version's one-transaction import), and a write on the event
    loop would stop every request meanwhile. Here the loop only enqueues; the thread waits for the
    lock (retrying without limit: an answer a client got is never dropped), commits whatever has
    queued up in one transaction, and resolves each `store`'s future once committed."""

    BATCH = 512
    # SQLite's own busy handler sleeps up to 100 ms between tries, long enough for an importer to
    # take the lock again and again; polling every millisecond gets it in the importer's pauses.
    POLL_SECONDS = 0.001

    def __init__(self, path: Path):
        self._db = _connect(path, busy_timeout=0.0)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mirrorapi-cache-writer", daemon=True)
        self._thread.start()

    def submit(self, row: tuple) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((row, future))
        return future

    def submit_hits(self, hits: dict) -> None:
        self._queue.put((hits, None))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._db.close()

    def _run(self) -> None:
        while True:
            jobs, stop = [self._queue.get()], False
            while jobs[-1] is not None and len(jobs) < self.BATCH:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if jobs[-1] is None:
                jobs.pop()
                stop = True
            if jobs:
                self._write(jobs)
            if stop:
                return

    def _write(self, jobs: list) -> None:
        waited_since, reported = time.monotonic(), 0.0
        while True:
            try:
                with _transaction(self._db):
                    results = []
                    for payload, future in jobs:
                        if future is None:
                            self._db.executemany(_COUNT_HITS, ((n, *key) for key, n in payload.items()))
                        elif isinstance(payload, _SessionRow):
                            results.append(self._db.execute(_INSERT_SESSION, payload).rowcount == 1)
                        else:
                            results.append(_write_entries(self._db, [payload]) == 1)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    return self._fail(jobs, exc)
                waited = time.monotonic() - waited_since
                if waited - reported >= 10.0:
                    reported = waited
                    logger.warning("cache writes wait for the database lock (another connection holds it, e.g. an "
                                   "import; %.0f s so far); %d writes queued, none dropped", waited, len(jobs))
                time.sleep(self.POLL_SECONDS)
            except sqlite3.Error as exc:
                return self._fail(jobs, exc)
        results = iter(results)
        for _, future in jobs:
            if future is not None:
                future.set_result(next(results))

    @staticmethod
    def _fail(jobs: list, exc: Exception) -> None:
        logger.error("cache write failed: %s (%d writes)", exc, len(jobs))
        for _, future in jobs:
            if future is not None:
                future.set_exception(exc)


# ------------------------------------------------------------------- StableToolBench folders
# StableToolBench's server cached its own failure placeholder; it is not a response, so it is not imported.
_PLACEHOLDERS = ("Failed to generate fake response",)


def _canonical_names(registry: ToolRegistry | None, category: str, tool: str, api: str) -> tuple[tuple, bool]:
    """(category, tool, api) as the server keys them: the registry's names when it knows the API."""
    if registry is not None:
        try:
            doc = registry.resolve(category, tool, api)
            return (doc.category, doc.tool, doc.api), True
        except UnknownName:
            pass
    return (standardize_category(category), standardize(tool), api_key_name(api)), False


def _fingerprint(folder: Path) -> str:
    """Changes when a file of the folder is added, removed or rewritten (cheap: stat only)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".json"):
                st = os.stat(os.path.join(root, name))
                digest.update(f"{os.path.relpath(os.path.join(root, name), folder)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _store(cache: ResponseCache, pairs: Iterable[dict], registry, provenance: str, report: dict) -> None:
    rows, resolved = [], {}
    for pair in pairs:
        names = (pair["category"], pair["tool_name"], pair["api_name"])
        if names not in resolved:
            resolved[names] = _canonical_names(registry, *names)
            if not resolved[names][1]:
                report["unresolved_apis"] += 1
        response = pair["response"]
        if response["error"] in _PLACEHOLDERS:
            report["skipped_placeholders"] += 1
            continue
        rows.append((*resolved[names][0], pair["tool_input"], response["error"], response["response"]))
    report["entries"] += len(rows)
    report["stored"] += cache.put_many(rows, provenance)


def import_stabletoolbench_cache(cache: ResponseCache, folder: str | os.PathLike, registry: ToolRegistry | None = None,
                                 origin: str | None = None, force: bool = False) -> dict:
    """Load a StableToolBench cache folder with provenance `imported:<origin>` (default: the folder's name).

    Done once per folder: an unchanged folder (same files, sizes and times) is skipped unless
    `force`. With a `registry`, names are resolved as the server resolves requests. Entries never
    replace recorded ones already in the cache (they do replace simulated ones). Returns a report.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise CacheError(f"StableToolBench cache folder not found: {folder}")
    report = {"origin": str(folder), "skipped": False, "entries": 0, "stored": 0, "unresolved_apis": 0,
              "skipped_placeholders": 0, "unreadable": []}
    fingerprint = _fingerprint(folder)
    if not force and cache.import_fingerprint(str(folder)) == fingerprint:
        report["skipped"] = True
        logger.info("cache folder %s was imported before and has not changed: not imported again", folder)
        return report
    try:
        pairs = read_stabletoolbench_cache(folder, on_bad=report["unreadable"].append)
        _store(cache, pairs, registry, IMPORTED + (origin or folder.name), report)
    except SourceError as exc:
        raise CacheError(str(exc)) from None
    cache.record_import(str(folder), fingerprint, report["entries"])
    logger.info("imported %s: %d entries (%d new), %d unreadable, %d placeholders skipped, %d APIs unknown "
                "to the tools folder", folder, report["entries"], report["stored"], len(report["unreadable"]),
                report["skipped_placeholders"], report["unresolved_apis"])
    return report


def import_pairs(cache: ResponseCache, path: str | os.PathLike, registry: ToolRegistry | None = None) -> dict:
    """Load real pairs (our JSONL schema) with provenance `real`; the first pair of a key wins."""
    report = {"origin": str(path), "skipped": False, "entries": 0, "stored": 0, "unresolved_apis": 0,
              "skipped_placeholders": 0, "unreadable": []}
    try:
        _store(cache, read_pairs_jsonl(path, on_bad=report["unreadable"].append), registry, REAL, report)
    except SourceError as exc:
        raise CacheError(str(exc)) from None
    return report


def _write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False, indent=4)
    os.replace(tmp, path)


def unsafe_name(name: str) -> str | None:
    """Why `name` cannot be a folder or file name of an export (None when it can): it must stay one
    path component inside the export folder, whatever a pairs file or a shared database holds."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\\" in name or "\0" in name:
        return f"{name[:80]!r} contains a path separator"
    if len(name.encode("utf-8")) > 200:
        return f"{name[:40]!r}... is longer than a file name may be"
    return None


def export_identity(cache: ResponseCache, identity: str | None) -> str:
    """The simulator identity an export writes: the one named, or the only one the cache holds
    ('' when it holds no simulated answer). Several and none named is an error: answers of two
    simulators must not be mixed in one benchmark cache."""
    identities = cache.identities()
    if identity is not None:
        if identity and identity not in identities:
            known = ", ".join(identities) or "none"
            raise CacheError(f"no simulated answers of identity {identity!r} in {cache.path} (identities: {known})")
        return identity
    if len(identities) > 1:
        raise CacheError(f"{cache.path} holds simulated answers of {len(identities)} simulator identities; name one "
                         f"with --identity ({', '.join(identities)}), or '' for recorded answers only")
    return next(iter(identities), RECORDED)


def export_stabletoolbench_cache(cache: ResponseCache, folder: str | os.PathLike, provenance: Iterable[str] = (),
                                 identity: str | None = None) -> dict:
    """Write the cache as a StableToolBench cache folder: the recorded answers plus the simulated
    answers of one simulator identity (see `export_identity`), i.e. what a server of that identity
    answers; `provenance`: only entries whose provenance starts with one of these prefixes.

    Keys are `str(arguments)` with the arguments in the order they were first received, which is
    the key StableToolBench's server computes (`str(json.loads(tool_input))`). Files of the APIs
    written are replaced; other files are left alone. Names that would leave `folder` (`..`, a `/`,
    an absolute path) are refused: those APIs are listed in the report's `refused`, nothing is written
    for them."""
    identity = export_identity(cache, identity)
    rows = cache.served_entries(identity, provenance)
    root = Path(folder).resolve()
    files = entries = 0
    refused = []
    for (category, tool, api), group in itertools.groupby(rows, key=lambda row: row[:3]):
        content = {str(json.loads(row[3])): json.loads(row[4]) for row in group}
        problem = next(filter(None, (unsafe_name(n) for n in (category, f"{tool}_for_{category}", f"{api}.json"))),
                       None)
        path = root / category / f"{tool}_for_{category}" / f"{api}.json"
        if problem is None and not path.resolve().is_relative_to(root):  # e.g. a symlink left in the folder
            problem = f"{path} resolves outside {root}"
        if problem is not None:
            refused.append(f"{category}/{tool}/{api} ({len(content)} entries): {problem}")
            logger.warning("export refused %s/%s/%s: %s", category, tool, api, problem)
            continue
        _write_json_atomically(path, content)
        files, entries = files + 1, entries + len(content)
    return {"folder": str(root), "identity": identity, "files": files, "entries": entries, "refused": refused}
