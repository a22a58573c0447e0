"""The store's interface, declared once (`Store`): what the server's request path and the cache commands may ask
of the response cache, whichever database holds it. `mirrorapi.serving.cache.sqlite.ResponseCache` (one SQLite
file) and `mirrorapi.serving.cache.postgres.PostgresCache` (a PostgreSQL database shared by many servers)
implement it.

Two sides:
- the request path, called on the server's event loop (async, abstract here: each backend has its own way not
  to block the loop): `lookup`, `store`, `recorded_examples`, the leases (`try_lease`, `release_lease`), the
  sessions (`session`, `update_session`), `health_counts`, `maintain`, `aclose`;
- the administrative side, plain calls (the `mirrorapi cache` commands, imports at start-up, exports, copies):
  written once here, over the backend's connection (`_execute`, `_transaction`), its write rules
  (`_write_entries`) and its own SQL (`sql`, a `Statements` in its dialect: `?` parameters for SQLite, `%s` for
  psycopg; no text is rewritten from one to the other).
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from mirrorapi.serving.cache.entries import (
    NO_SESSION,
    RECORDED,
    SCHEMA_VERSION,
    CacheError,
    Call,
    Entry,
    new_entry,
    served,
)

IMPORT_TRANSACTION_ROWS = 200  # rows per import transaction (a few ms): a server's writes wait for one slice
IMPORT_PAUSE_SECONDS = 0.002  # between slices, so that a waiting writer gets the lock (SQLite's is not fair)
HIT_FLUSH_ROWS = 500  # hit counts written per transaction by a server (about a millisecond)
# Expired sessions deleted per statement, and at most so many statements per maintenance pass (every few seconds):
# one batch a pass fell behind clients opening more than 200 sessions a second (an RL trainer's episodes).
FORGET_SESSIONS_BATCH = 1000
FORGET_SESSIONS_BATCHES = 20

SessionState = tuple[str, int, list[str]]  # a session's history digest, its calls so far, its kept history lines
Session = tuple[str, str, int, str, float]  # a session row: id, digest, steps, lines (JSON), last used
Advance = Callable[[SessionState | None], SessionState]  # a session's next state from its state (None: new)


@dataclass(frozen=True)
class Statements:
    """The SQL of the administrative side, in one backend's dialect. `provenance_prefix` is the condition on one
    provenance prefix that `entries` and `served_entries` join with OR for the prefixes asked for."""

    count_hits: str  # (hits to add, entry id)
    prune: str  # (identity)
    forget_import: str  # (origin)
    record_import: str  # (origin, fingerprint, entries, imported_at)
    examples: str  # (category, tool, api, limit)
    entries: str  # {where}: the provenance filter
    served_entries: str  # (identity, ...) {where}: the provenance filter
    provenance_prefix: str  # (prefix, prefix)
    rows: str  # every column of every entry, in ENTRY_COLUMNS' order
    sessions: str
    imports: str
    identities: str
    import_fingerprint: str  # (origin)
    count: str
    open_sessions: str  # (used since)
    session_count: str
    stats_by_provenance: str
    stats_by_identity: str
    stats_totals: str
    stats_imports: str
    stats_sessions: str


def rows_of(cursor: Any) -> Iterator[tuple]:
    """A cursor's rows, read in batches."""
    while batch := cursor.fetchmany(1000):
        yield from (tuple(row) for row in batch)


class Store(abc.ABC):
    """The response cache of one database (see the module doc)."""

    location: str  # the file or URL (without password), for messages
    sql: ClassVar[Statements]  # the backend's own SQL for the administrative side
    _pending_hits: dict[int, int]  # entry id -> hits counted but not written yet

    # ---------------------------------------------------------------- the request path (the server's event loop)
    @abc.abstractmethod
    async def lookup(self, call: Call, identity: str, count_hit: bool = True) -> tuple[bytes, str] | None:
        """(observation JSON as bytes, provenance) a server of `identity` answers `call` with (`served`), or None;
        counts the hit unless told not to (an answer another process simulated for a call this one waited on is a
        coalesced miss, as its metrics say, not a hit)."""

    @abc.abstractmethod
    async def store(self, entry: Entry, lease_holder: str | None = None) -> bool:
        """Store an answer by the rules of `entries` (and give up the lease `lease_holder` took on its call);
        returns once committed, whether it was stored."""

    @abc.abstractmethod
    async def recorded_examples(self, category: str, tool: str, api: str, limit: int) -> list[tuple[str, str]]:
        """(arguments, observation) of recorded entries of one API (few-shot examples), as `examples`."""

    @abc.abstractmethod
    async def try_lease(self, call: Call, identity: str, holder: str, seconds: float) -> bool:
        """Whether `holder` may simulate `call` now: nobody else holds an unexpired lease on it (then it holds one,
        for `seconds`)."""

    @abc.abstractmethod
    async def release_lease(self, call: Call, identity: str, holder: str) -> None:
        """Give up `holder`'s lease on `call`."""

    @abc.abstractmethod
    async def session(self, session_id: str, idle_seconds: float) -> SessionState | None:
        """The state of a session used within `idle_seconds`, else None."""

    @abc.abstractmethod
    async def update_session(self, session_id: str, idle_seconds: float, advance: Advance) -> SessionState:
        """Apply `advance` to the session's state (None: new or expired) in one transaction; the new state."""

    async def health_counts(self, idle_seconds: float) -> tuple[int, int, int]:
        """(entries, sessions used within `idle_seconds`, answers stored under a session history) for /health.
        Here on the calling thread: a local file answers in microseconds; a store across the network answers on
        its async connections instead, so that a probe never stalls the server's loop."""
        return self.count(), self.open_sessions(idle_seconds), self.session_count()

    @abc.abstractmethod
    async def maintain(self, idle_seconds: float) -> None:
        """Write the counted hits, forget sessions idle longer than `idle_seconds` and expired leases."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Write everything handed over and the counted hits, then close."""

    # ----------------------------------------------------------------------- what each backend gives
    @abc.abstractmethod
    def _execute(self, sql: str, parameters: Iterable[Any] = ()) -> Any:
        """A cursor over the result of one statement (run in autocommit or the open transaction)."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager:
        """A write transaction, committed when the block ends."""

    @abc.abstractmethod
    def _write_entries(self, entries: list[Entry]) -> int:
        """Insert entries by the rules of `entries` inside the open transaction; how many were stored."""

    @abc.abstractmethod
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
        """(observation JSON, provenance) that a server of `identity` answers (see `served`), or None."""

    @abc.abstractmethod
    def close(self) -> None:
        """Write what is pending and close."""

    # ------------------------------------------------------------------------------- writes
    def flush_hits(self) -> None:
        """Write the hit counts kept in memory (at close; the server adds them in `maintain`)."""
        hits, self._pending_hits = self._pending_hits, {}
        if hits:
            with self._transaction():
                for id_ in sorted(hits):  # one lock order for every writer: concurrent flushes never deadlock
                    self._execute(self.sql.count_hits, (hits[id_], id_))

    def _served(self, rows: list, identity: str, history: str, count_hit: bool) -> tuple[Any, Any] | None:
        """(observation, provenance) of the row `served` picks, its hit counted in memory; None: no row serves."""
        row = served(rows, identity, history)
        if row is None:
            return None
        if count_hit:
            self._pending_hits[row[0]] = self._pending_hits.get(row[0], 0) + 1
        return row[1], row[2]

    def put(
        self,
        category: str,
        tool: str,
        api: str,
        arguments: Any,
        error: str,
        response: Any,
        provenance: str,
        history: str = NO_SESSION,
        steps: int = 0,
    ) -> bool:
        """Store one answer (committed on return); False when an entry that wins is already there.
        `arguments`: the argument object (or its JSON text) as received; its key order is kept."""
        entry = new_entry(category, tool, api, arguments, error, response, provenance, time.time(), history, steps)
        with self._transaction():
            return self._write_entries([entry]) == 1

    def put_many(self, rows: Iterable[tuple[str, str, str, Any, str, Any]], provenance: str) -> int:
        """Store (category, tool, api, arguments, error, response) rows; returns how many were new.
        Committed in slices of IMPORT_TRANSACTION_ROWS, so that a server sharing the store never
        waits long for the write lock (an interrupted import is simply run again: nothing doubles)."""
        now, stored, first = time.time(), 0, True
        rows = iter(rows)
        while chunk := [
            new_entry(c, t, a, args, e, r, provenance, now)
            for c, t, a, args, e, r in itertools.islice(rows, IMPORT_TRANSACTION_ROWS)
        ]:
            if not first:
                time.sleep(IMPORT_PAUSE_SECONDS)
            first = False
            with self._transaction():
                stored += self._write_entries(chunk)
        return stored

    def put_entries(self, entries: Iterable[Entry]) -> int:
        """Copy whole entries (hit counts and times included) by the same rules; how many were new."""
        stored, entries = 0, iter(entries)
        while chunk := list(itertools.islice(entries, IMPORT_TRANSACTION_ROWS)):
            with self._transaction():
                stored += self._write_entries(chunk)
        return stored

    @abc.abstractmethod
    def put_sessions(self, sessions: Iterable[Session]) -> int:
        """Copy sessions that the store does not hold yet; how many."""

    def prune(self, identity: str) -> int:
        """Delete the simulated answers of one simulator identity (in sessions too); returns how many."""
        if not identity:
            raise CacheError("prune takes a simulator identity; recorded answers are never pruned")
        with self._transaction():
            return self._execute(self.sql.prune, (identity,)).rowcount

    def record_import(self, origin: str, fingerprint: str, entries: int) -> None:
        with self._transaction():
            self._execute(self.sql.forget_import, (origin,))
            self._execute(self.sql.record_import, (origin, fingerprint, entries, time.time()))

    # ------------------------------------------------------------------------------- reads
    def examples(self, category: str, tool: str, api: str, limit: int = 256) -> list[tuple[str, str]]:
        """(arguments, observation) of recorded entries (real or imported, never simulated) of one API."""
        return [tuple(row) for row in self._execute(self.sql.examples, (category, tool, api, limit)).fetchall()]

    def entries(self, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments, observation, provenance) of the answers outside sessions, in key
        order; `provenance`: prefixes to keep."""
        where, parameters = self._provenance_filter(provenance)
        return iter(self._execute(self.sql.entries.format(where=where), parameters).fetchall())

    def served_entries(self, identity: str, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments as first received, observation) of every call outside sessions a
        server of `identity` answers from the cache, by API, each API's calls in the order they were first stored;
        `provenance`: prefixes to keep. A call
        has a recorded answer or simulated ones, never both: one row per call."""
        where, parameters = self._provenance_filter(provenance)
        return rows_of(self._execute(self.sql.served_entries.format(where=where), [identity, *parameters]))

    def rows(self) -> Iterator[Entry]:
        """Every entry, every column (a copy to another store)."""
        return (Entry(*row) for row in rows_of(self._execute(self.sql.rows)))

    def sessions(self) -> Iterator[Session]:
        """Every session: (id, digest, steps, lines JSON, last used)."""
        return rows_of(self._execute(self.sql.sessions))

    def imports(self) -> list[tuple[str, str, int, float]]:
        """(origin, fingerprint, entries, imported_at) of every folder imported."""
        return [tuple(row) for row in self._execute(self.sql.imports).fetchall()]

    def identities(self) -> dict[str, int]:
        """Simulated entries outside sessions (what an export writes) per simulator identity."""
        return dict(self._execute(self.sql.identities).fetchall())

    def import_fingerprint(self, origin: str) -> str | None:
        row = self._execute(self.sql.import_fingerprint, (origin,)).fetchone()
        return row[0] if row else None

    def count(self) -> int:
        return self._execute(self.sql.count).fetchone()[0]

    def open_sessions(self, idle_seconds: float) -> int:
        """Sessions used within `idle_seconds`."""
        return self._execute(self.sql.open_sessions, (time.time() - idle_seconds,)).fetchone()[0]

    def session_count(self) -> int:
        """Answers stored under a session's history."""
        return self._execute(self.sql.session_count).fetchone()[0]

    def stats(self) -> dict:
        by_provenance = dict(self._execute(self.sql.stats_by_provenance).fetchall())
        by_identity = {
            identity: {"entries": n, "hits": int(hits or 0), "first": first, "last": last}
            for identity, n, hits, first, last in self._execute(self.sql.stats_by_identity).fetchall()
        }
        totals = self._execute(self.sql.stats_totals).fetchone()
        imports = [
            {"origin": o, "entries": n, "imported_at": t}
            for o, n, t in self._execute(self.sql.stats_imports).fetchall()
        ]
        sessions = self._execute(self.sql.stats_sessions).fetchone()[0]
        return {
            "location": self.location,
            "schema_version": SCHEMA_VERSION,
            "entries": totals[0],
            "apis": totals[2],
            "errors": int(totals[3] or 0),
            "hits": int(totals[1]),
            "recorded": int(totals[4] or 0),
            "by_identity": by_identity,
            "by_provenance": by_provenance,
            "imports": imports,
            "session_entries": int(totals[5] or 0),
            "sessions": sessions,
        }

    def _provenance_filter(self, provenance: Iterable[str]) -> tuple[str, list[str]]:
        prefixes = list(provenance)
        if not prefixes:
            return "", []
        # A prefix compared as text, the same on both stores (LIKE ignored ASCII case on SQLite only, and read `_`
        # and `%` in a prefix as wildcards).
        clause = " AND (" + " OR ".join([self.sql.provenance_prefix] * len(prefixes)) + ")"
        return clause, [value for p in prefixes for value in (p, p)]
