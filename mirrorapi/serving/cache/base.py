"""What the response cache holds and the rules every store keeps, whichever database holds it.

An entry answers one *call*: (category, tool, api, the canonical JSON of the arguments, the session
history digest), the digest being '' for a call outside a session (`Call`). Next to the key it keeps the
arguments as first received (key order included: StableToolBench looks calls up by
`str(json.loads(tool_input))`, so that is the order an export writes), the observation, its provenance
(`real`, `imported:<origin>`, `simulated:<identity>`), when it was created and how often it was served.

Recorded answers (`real`, `imported:*`; identity '') are shared by every simulator and exist only
outside sessions. A simulated answer belongs to the *simulator identity* that produced it (model,
prompt format, decoding settings: `mirrorapi.serving.simulator.simulator_identity`); a lookup under one
identity never returns another identity's answer. Which entry serves a call (`served`): its recorded
answer, else the answer of the looking identity under the call's own history. A simulated answer is
not stored where a recorded one exists, and a recording removes every simulated answer of the call.

Sessions (`mirrorapi.serving.sessions`) live in the store too: per session id its history digest,
the number of calls so far, the newest history lines and when it was last used. Leases say which
server process is simulating a call right now, so that servers sharing a store simulate a call once.

`SqlCache` implements the administrative side (statistics, exports, identities, pruning, imports)
once in SQL both SQLite and PostgreSQL run; `mirrorapi.serving.cache.sqlite` and `.postgres` add
the schema, the writes and the request path of each database.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import itertools
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mirrorapi.records import canonical_json, observation_json

SCHEMA_VERSION = 3
REAL = "real"
IMPORTED = "imported:"  # + origin (the folder or file name the entries came from)
SIMULATED = "simulated:"  # + the simulator identity
RECORDED = ""  # the `identity` of recorded entries (real, imported:*): shared by every simulator
NO_SESSION = ""  # the `history` of calls outside a session
IMPORT_TRANSACTION_ROWS = 200  # rows per import transaction (a few ms): a server's writes wait for one slice
IMPORT_PAUSE_SECONDS = 0.002  # between slices, so that a waiting writer gets the lock (SQLite's is not fair)
HIT_FLUSH_ROWS = 500  # hit counts written per transaction by a server (about a millisecond)
# The columns of an entry, in the order `Entry` holds them and `rows()` / `put_entries` copy them.
ENTRY_COLUMNS = ("category", "tool", "api", "arguments", "history", "identity", "steps", "arguments_as_sent",
                 "error", "observation", "provenance", "created", "hits")


class CacheError(Exception):
    """The cache database or a folder to import cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the cache keys it."""

    category: str
    tool: str
    api: str
    arguments: str  # canonical_json of the argument object
    history: str = NO_SESSION  # digest of the session's earlier calls and answers; '' outside a session

    def digest(self) -> bytes:
        """A fixed-size key for databases whose indexes cannot hold long text (PostgreSQL's btree)."""
        return hashlib.sha256("\0".join((self.category, self.tool, self.api, self.arguments,
                                         self.history)).encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored answer, every column (see ENTRY_COLUMNS)."""

    category: str
    tool: str
    api: str
    arguments: str
    history: str
    identity: str
    steps: int  # earlier calls in the session history (0 outside a session)
    arguments_as_sent: str
    error: str
    observation: str  # the whole {"error", "response"} answer, compact JSON
    provenance: str
    created: float
    hits: int = 0

    @property
    def call(self) -> Call:
        return Call(self.category, self.tool, self.api, self.arguments, self.history)


def identity_of(provenance: str) -> str:
    """The `identity` column of an entry of this provenance ('' for recorded answers)."""
    return provenance[len(SIMULATED):] if provenance.startswith(SIMULATED) else RECORDED


def new_entry(category: str, tool: str, api: str, arguments: Any, error: str, response: Any, provenance: str,
              now: float, history: str = NO_SESSION, steps: int = 0) -> Entry:
    """`arguments`: the argument object, or its JSON text; either way its key order is kept as given."""
    as_sent = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False,
                                                                       separators=(",", ":"))
    key = canonical_json(json.loads(as_sent) if isinstance(arguments, str) else arguments)
    identity = identity_of(provenance)
    if history and not identity:
        raise CacheError("a recorded answer belongs to no session (history must be empty)")
    return Entry(category, tool, api, key, history, identity, steps, as_sent, error,
                 observation_json(error, response), provenance, now)


def served(rows: Iterable[tuple], identity: str, history: str) -> tuple | None:
    """Of a call's rows (id, observation, provenance, identity, history), the one a server of `identity`
    answers after `history` with: the recorded one, else its own."""
    own = None
    for row in rows:
        if not row[3]:
            return row
        if row[3] == identity and row[4] == history:
            own = row
    return own


def lease_holder() -> str:
    """This process's name in the leases table (host, pid and a random part: pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SqlCache(abc.ABC):
    """The administrative side of a cache, in SQL that SQLite and PostgreSQL both run (`?` parameters;
    the PostgreSQL store rewrites them). Subclasses give `_execute`, `_transaction` and the writes."""

    location: str  # the file or URL (without password), for messages
    _pending_hits: dict[int, int]  # entry id -> hits counted but not written yet

    # ------------------------------------------------------------------------------- to implement
    @abc.abstractmethod
    def _execute(self, sql: str, parameters: Iterable[Any] = ()) -> Any:
        """A cursor over the result of one statement (run in autocommit or the open transaction)."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager:
        """A write transaction, committed when the block ends."""

    @abc.abstractmethod
    def _write_entries(self, entries: list[Entry]) -> int:
        """Insert entries by the rules of the module doc inside the open transaction; how many were stored."""

    @abc.abstractmethod
    def get(self, category: str, tool: str, api: str, arguments: str, identity: str = RECORDED,
            history: str = NO_SESSION, count_hit: bool = True) -> tuple[str, str] | None:
        """(observation JSON, provenance) that a server of `identity` answers (see `served`), or None."""

    def flush_hits(self) -> None:
        """Write the hit counts kept in memory (at close; the server adds them in `maintain`)."""
        hits, self._pending_hits = self._pending_hits, {}
        if hits:
            with self._transaction():
                for id_ in sorted(hits):  # one lock order for every writer: concurrent flushes never deadlock
                    self._execute("UPDATE entries SET hits = hits + ? WHERE id = ?", (hits[id_], id_))

    def _served(self, rows: list, identity: str, history: str, count_hit: bool) -> tuple[Any, Any] | None:
        """(observation, provenance) of the row `served` picks, its hit counted in memory; None: no row serves."""
        row = served(rows, identity, history)
        if row is None:
            return None
        if count_hit:
            self._pending_hits[row[0]] = self._pending_hits.get(row[0], 0) + 1
        return row[1], row[2]

    @abc.abstractmethod
    def close(self) -> None:
        """Write what is pending and close."""

    # ------------------------------------------------------------------- the server's side (async)
    @abc.abstractmethod
    async def maintain(self, idle_seconds: float) -> None:
        """Write the counted hits, forget sessions idle longer than `idle_seconds` and expired leases."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Write everything handed over and the counted hits, then close."""

    async def health_counts(self, idle_seconds: float) -> tuple[int, int, int]:
        """(entries, sessions used within `idle_seconds`, answers stored under a session history) for /health.
        Here on the calling thread: a local file answers in microseconds; a store across the network
        answers on its async connections instead, so that a probe never stalls the server's loop."""
        return self.count(), self.open_sessions(idle_seconds), self.session_count()

    # ------------------------------------------------------------------------------- writes
    def put(self, category: str, tool: str, api: str, arguments: Any, error: str, response: Any,
            provenance: str, history: str = NO_SESSION, steps: int = 0) -> bool:
        """Store one answer (committed on return); False when an entry that wins is already there.
        `arguments`: the argument object (or its JSON text) as received; its key order is kept."""
        entry = new_entry(category, tool, api, arguments, error, response, provenance, time.time(), history, steps)
        with self._transaction():
            return self._write_entries([entry]) == 1

    def put_many(self, rows: Iterable[tuple[str, str, str, Any, str, Any]], provenance: str) -> int:
        """Store (category, tool, api, arguments, error, response) rows; returns how many were new.
        Committed in slices of IMPORT_TRANSACTION_ROWS, so that a server sharing the store never
        waits long for the write lock (an interrupted import is simply run again: nothing doubles)."""
        import itertools
        now, stored, first = time.time(), 0, True
        rows = iter(rows)
        while chunk := [new_entry(c, t, a, args, e, r, provenance, now)
                        for c, t, a, args, e, r in itertools.islice(rows, IMPORT_TRANSACTION_ROWS)]:
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

    def prune(self, identity: str) -> int:
        """Delete the simulated answers of one simulator identity (in sessions too); returns how many."""
        if not identity:
            raise CacheError("prune takes a simulator identity; recorded answers are never pruned")
        with self._transaction():
            return self._execute("DELETE FROM entries WHERE identity = ?", (identity,)).rowcount

    def put_sessions(self, sessions: Iterable[tuple[str, str, int, str, float]]) -> int:
        """Copy sessions (id, digest, steps, lines JSON, last used) that the store does not hold yet."""
        stored, sessions = 0, iter(sessions)
        while chunk := list(itertools.islice(sessions, IMPORT_TRANSACTION_ROWS)):
            with self._transaction():
                for row in chunk:
                    stored += self._execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                                            row).rowcount
        return stored

    def record_import(self, origin: str, fingerprint: str, entries: int) -> None:
        with self._transaction():
            self._execute("DELETE FROM imports WHERE origin = ?", (origin,))
            self._execute("INSERT INTO imports VALUES (?, ?, ?, ?)", (origin, fingerprint, entries, time.time()))

    # ------------------------------------------------------------------------------- reads
    def examples(self, category: str, tool: str, api: str, limit: int = 256) -> list[tuple[str, str]]:
        """(arguments, observation) of recorded entries (real or imported, never simulated) of one API."""
        return [tuple(row) for row in self._execute(
            "SELECT arguments, observation FROM entries WHERE category = ? AND tool = ? AND api = ? "
            "AND identity = '' ORDER BY arguments LIMIT ?", (category, tool, api, limit)).fetchall()]

    def entries(self, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments, observation, provenance) of the answers outside sessions, in key
        order; `provenance`: prefixes to keep."""
        where, parameters = _provenance_filter(provenance)
        return iter(self._execute(f"SELECT category, tool, api, arguments, observation, provenance FROM entries "
                                  f"WHERE history = ''{where} ORDER BY category, tool, api, arguments, identity",
                                  parameters).fetchall())

    def served_entries(self, identity: str, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments as first received, observation) of every call outside sessions a
        server of `identity` answers from the cache, in key order; `provenance`: prefixes to keep. A call
        has a recorded answer or simulated ones, never both: one row per call."""
        where, parameters = _provenance_filter(provenance)
        return iter(self._execute(
            f"SELECT category, tool, api, arguments_as_sent, observation FROM entries WHERE history = '' AND "
            f"identity IN ('', ?){where} ORDER BY category, tool, api, arguments", [identity, *parameters]))

    def rows(self) -> Iterator[Entry]:
        """Every entry, every column (a copy to another store)."""
        cursor = self._execute(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM entries")
        while batch := cursor.fetchmany(1000):
            yield from (Entry(*row) for row in batch)

    def sessions(self) -> Iterator[tuple[str, str, int, str, float]]:
        """Every session: (id, digest, steps, lines JSON, last used)."""
        cursor = self._execute("SELECT id, digest, steps, lines, used FROM sessions")
        while batch := cursor.fetchmany(1000):
            yield from (tuple(row) for row in batch)

    def imports(self) -> list[tuple[str, str, int, float]]:
        """(origin, fingerprint, entries, imported_at) of every folder imported."""
        return [tuple(row) for row in self._execute("SELECT origin, fingerprint, entries, imported_at FROM imports "
                                                    "ORDER BY imported_at").fetchall()]

    def identities(self) -> dict[str, int]:
        """Simulated entries per simulator identity."""
        return dict(self._execute("SELECT identity, count(*) FROM entries WHERE identity != '' "
                                  "GROUP BY identity ORDER BY identity").fetchall())

    def import_fingerprint(self, origin: str) -> str | None:
        row = self._execute("SELECT fingerprint FROM imports WHERE origin = ?", (origin,)).fetchone()
        return row[0] if row else None

    def count(self) -> int:
        return self._execute("SELECT count(*) FROM entries").fetchone()[0]

    def open_sessions(self, idle_seconds: float) -> int:
        """Sessions used within `idle_seconds`."""
        return self._execute("SELECT count(*) FROM sessions WHERE used >= ?",
                             (time.time() - idle_seconds,)).fetchone()[0]

    def session_count(self) -> int:
        """Answers stored under a session's history."""
        return self._execute("SELECT count(*) FROM entries WHERE history != ''").fetchone()[0]

    def stats(self) -> dict:
        by_provenance = dict(self._execute("SELECT provenance, count(*) FROM entries GROUP BY provenance").fetchall())
        by_identity = {identity: {"entries": n, "hits": int(hits or 0), "first": first, "last": last}
                       for identity, n, hits, first, last in self._execute(
                           "SELECT identity, count(*), sum(hits), min(created), max(created) FROM entries "
                           "WHERE identity != '' GROUP BY identity ORDER BY identity").fetchall()}
        totals = self._execute(
            "SELECT count(*), coalesce(sum(hits), 0), count(DISTINCT category || '/' || tool || '/' || api), "
            "sum(CASE WHEN error != '' THEN 1 ELSE 0 END), sum(CASE WHEN identity = '' THEN 1 ELSE 0 END), "
            "sum(CASE WHEN history != '' THEN 1 ELSE 0 END) FROM entries").fetchone()
        imports = [{"origin": o, "entries": n, "imported_at": t} for o, n, t in
                   self._execute("SELECT origin, entries, imported_at FROM imports ORDER BY imported_at").fetchall()]
        sessions = self._execute("SELECT count(*) FROM sessions").fetchone()[0]
        return {"location": self.location, "schema_version": SCHEMA_VERSION, "entries": totals[0],
                "apis": totals[2], "errors": int(totals[3] or 0), "hits": int(totals[1]),
                "recorded": int(totals[4] or 0), "by_identity": by_identity, "by_provenance": by_provenance,
                "imports": imports, "session_entries": int(totals[5] or 0), "sessions": sessions}


def _provenance_filter(provenance: Iterable[str]) -> tuple[str, list[str]]:
    prefixes = list(provenance)
    if not prefixes:
        return "", []
    return " AND (" + " OR ".join("provenance LIKE ?" for _ in prefixes) + ")", [p + "%" for p in prefixes]
