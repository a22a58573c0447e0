"""The shared store: the response cache and the sessions on PostgreSQL (`PostgresCache`, `cache_url`).

Same schema and rules as the SQLite store (`base`): entries keyed by call + session history digest with
their identity, provenance, created time and hit count; sessions; import records; leases. Every server
on every host that is given the same `cache_url` answers from, and stores into, the same entries, and
continues the same sessions.

Differences from the SQLite file, each for a reason:
- Entries and leases are keyed by `Call.digest()` (sha256 of the call) next to the readable columns: a
  PostgreSQL b-tree entry holds at most ~2.7 kB and a call's arguments may be 16 kB. Sessions likewise by
  the sha256 of their id (a client names its session; the id may be long).
- Text key columns use the "C" collation: byte order, as SQLite sorts, so that exports list entries in
  the same order from either store, whatever the database's default locale.
- Connections ask for `synchronous_commit = off` (unless the URL's `options` set it): a commit returns
  once PostgreSQL has it (every other server sees it at once), without waiting for the disk flush,
  which follows within a fraction of a second: a server process killed at any moment loses no answered entry
  (as with SQLite's `synchronous=NORMAL`), but a crash of PostgreSQL itself or of its host may lose the last
  fraction of a second (up to 3 x wal_writer_delay), which is re-simulated on the next miss.
- The request path is async (psycopg 3's `AsyncConnection` from a `psycopg_pool` pool, opened on the
  server's event loop at its first use): a query waits for the network without blocking the loop. The
  administrative side (`Store`'s: CLI commands, imports at start-up, /health's counts) uses one plain
  connection in autocommit mode.
- A request waits for a pool connection as long as a connection may take to open: the URL's `connect_timeout`
  (libpq's, in seconds; 10 unless the URL sets it), not psycopg's 30 s. A database gone away is then one
  error observation after that wait, and a client that wants it sooner says so in the URL.
- Hit counts are kept in memory and added (`hits = hits + n`, in id order so that servers never
  deadlock on each other) by `maintain()`, as the SQLite store does.

The schema is `postgres_schema`. Every statement is PostgreSQL's own (psycopg's `%s` parameters), the
administrative ones in `STATEMENTS` (see `store.Store`); what both stores share is in `entries` and `store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mirrorapi.serving.cache.entries import ENTRY_COLUMNS, NO_SESSION, RECORDED, CacheError, Call, Entry
from mirrorapi.serving.cache.postgres_schema import TABLE_NAMES, open_schema
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

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

logger = logging.getLogger(__name__)

POOL_CONNECTIONS = 16  # per server process: queries are short, a miss holds none while the engine works
CONNECT_TIMEOUT_SECONDS = 10

_COLUMNS = ", ".join(ENTRY_COLUMNS)
_VALUES = ", ".join(["%s"] * (len(ENTRY_COLUMNS) + 1))
_INSERT = f"INSERT INTO entries (call, {_COLUMNS}) VALUES ({_VALUES}) ON CONFLICT (call, identity) DO NOTHING"
# A simulated answer is not stored where a recorded one exists (it would never be served)...
_INSERT_SIMULATED = (
    f"INSERT INTO entries (call, {_COLUMNS}) SELECT {_VALUES} WHERE NOT EXISTS "
    "(SELECT 1 FROM entries WHERE call = %s AND identity = '') "
    "ON CONFLICT (call, identity) DO NOTHING"
)
# ... and a recorded answer replaces every simulated answer of the same call, in every session history.
_DROP_SHADOWED = (
    "DELETE FROM entries WHERE category = %s AND tool = %s AND api = %s AND arguments = %s AND identity != ''"
)
# A server's store of a simulated answer and the release of its lease, in one statement (one round trip, one
# implicit transaction): a data-modifying CTE runs whether the insert stores a row or not.
_STORE_SIMULATED = (
    "WITH released AS (DELETE FROM leases WHERE call = %s AND identity = %s AND holder = %s) " + _INSERT_SIMULATED
)
# The recorded row and the simulated rows of each identity of a call: outside a session its one digest;
# inside one, also the digest of the call under its history. (An array parameter costs more to send.)
_SELECT = "SELECT id, observation, provenance, identity, history FROM entries WHERE "
_FIND = {1: _SELECT + "call = %s", 2: _SELECT + "call IN (%s, %s)"}
_COUNT_HITS = "UPDATE entries SET hits = hits + %s WHERE id = %s"
_TAKE_LEASE = (
    "INSERT INTO leases VALUES (%s, %s, %s, %s) ON CONFLICT (call, identity) DO UPDATE SET "
    "holder = excluded.holder, expires = excluded.expires "
    "WHERE leases.expires < %s OR leases.holder = excluded.holder"
)
_RELEASE_LEASE = "DELETE FROM leases WHERE call = %s AND identity = %s AND holder = %s"
_SESSION = "SELECT digest, steps, lines FROM sessions WHERE key = %s AND used >= %s"
_SESSION_FOR_UPDATE = "SELECT digest, steps, lines, used FROM sessions WHERE key = %s FOR UPDATE"
_PUT_SESSION = (
    "INSERT INTO sessions VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET "
    "digest = excluded.digest, steps = excluded.steps, lines = excluded.lines, used = excluded.used"
)
_NEW_SESSION = "INSERT INTO sessions VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING"
# /health's three counts in one round trip (count(*) reads the table: a probe every few seconds, not per request).
_HEALTH_COUNTS = (
    "SELECT (SELECT count(*) FROM entries), (SELECT count(*) FROM sessions WHERE used >= %s), "
    "(SELECT count(*) FROM entries WHERE history != '')"
)
_FORGET_SESSIONS = "DELETE FROM sessions WHERE key IN (SELECT key FROM sessions WHERE used < %s LIMIT %s)"
_FORGET_LEASES = "DELETE FROM leases WHERE expires < %s"
_EXAMPLES = (
    "SELECT arguments, observation FROM entries WHERE category = %s AND tool = %s AND api = %s "
    "AND identity = '' ORDER BY arguments LIMIT %s"
)
# The administrative side's statements (`store.Store`).
STATEMENTS = Statements(
    count_hits=_COUNT_HITS,
    prune="DELETE FROM entries WHERE identity = %s",
    forget_import="DELETE FROM imports WHERE origin = %s",
    record_import="INSERT INTO imports VALUES (%s, %s, %s, %s)",
    examples=_EXAMPLES,
    entries="SELECT category, tool, api, arguments, observation, provenance FROM entries WHERE history = ''{where} "
    "ORDER BY category, tool, api, arguments, identity",
    # Within an API, calls in the order they were first stored (an imported StableToolBench file's own order: its
    # GPT server shows a file's first entries as examples), a call's recorded answer after its simulated ones.
    served_entries="SELECT category, tool, api, arguments_as_sent, observation FROM entries WHERE history = '' AND "
    "identity IN ('', %s){where} ORDER BY category, tool, api, "
    "min(id) OVER (PARTITION BY category, tool, api, arguments), identity DESC",
    provenance_prefix="left(provenance, length(%s)) = %s",
    rows=f"SELECT {_COLUMNS} FROM entries",
    sessions="SELECT id, digest, steps, lines, used FROM sessions",
    imports="SELECT origin, fingerprint, entries, imported_at FROM imports ORDER BY imported_at",
    identities=(
        "SELECT identity, count(*) FROM entries WHERE identity != '' AND history = '' "
        "GROUP BY identity ORDER BY identity"
    ),
    import_fingerprint="SELECT fingerprint FROM imports WHERE origin = %s",
    count="SELECT count(*) FROM entries",
    open_sessions="SELECT count(*) FROM sessions WHERE used >= %s",
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


def _keys(call: Call) -> tuple[bytes, ...]:
    """The digests whose rows may serve `call`: the call outside a session, and inside its history."""
    outside = Call(call.category, call.tool, call.api, call.arguments).digest()
    return (outside,) if not call.history else (outside, call.digest())


def _row(entry: Entry) -> tuple:
    if "\0" in entry.error or "\0" in entry.rationale:  # PostgreSQL text holds no NUL (SQLite does); the served
        # observation is JSON, where it is escaped and kept
        entry = dataclasses.replace(
            entry, error=entry.error.replace("\0", "\ufffd"), rationale=entry.rationale.replace("\0", "\ufffd")
        )
    return (entry.call.digest(), *entry.values())


def session_key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()


def _write_entries(db, entries: Iterable[Entry]) -> int:
    """Insert entries (inside a transaction, on a sync connection) by the rules of the cache. Each statement
    goes as one `executemany` (psycopg pipelines it: one round trip per batch, not one per row, which is what
    an import into a database on another host costs). Recorded answers first: a simulated answer of the same
    call in the batch is then refused, as it would be after them in any order."""
    recorded, simulated = [], []
    for entry in entries:
        if entry.identity:
            simulated.append((*_row(entry), Call(entry.category, entry.tool, entry.api, entry.arguments).digest()))
        else:
            recorded.append(_row(entry))
    stored = 0
    with db.cursor() as cursor:
        if recorded:
            cursor.executemany(_INSERT, recorded)
            if cursor.rowcount:  # (where a call was recorded before, there is no simulated row to drop)
                stored += cursor.rowcount
                cursor.executemany(_DROP_SHADOWED, [row[1:5] for row in recorded])
        if simulated:
            cursor.executemany(_INSERT_SIMULATED, simulated)
            stored += cursor.rowcount
    return stored


def connection_string(url: str) -> str:
    """`url` with what the cache asks of every connection, unless the URL says otherwise (module doc)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        # libpq's message quotes the part it could not read, which may be the password (`u:s3cret%zz@...`)
        why = _one_line(exc) if "@" not in url else "its message is not shown: it may quote the password"
        raise CacheError(f"cache_url is not a PostgreSQL URL libpq can read ({why})") from None
    extra: dict[str, Any] = {}
    options = str(given.get("options") or "")
    if "synchronous_commit" not in options:
        extra["options"] = (options + " -c synchronous_commit=off").strip()
    if "application_name" not in given:
        extra["application_name"] = "mirrorapi"
    if "connect_timeout" not in given:
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    return make_conninfo(url, **extra)


def wait_seconds(conninfo: str) -> float:
    """How long a request waits for a connection: the `connect_timeout` of `conninfo` (as `connection_string` wrote
    it), in whole seconds; 0 or less (libpq: wait for ever) or an unreadable value gives the default, since a
    server must not hold a request for ever."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        seconds = int(str(conninfo_to_dict(conninfo).get("connect_timeout", "")).strip())
    except ValueError:
        return float(CONNECT_TIMEOUT_SECONDS)
    return float(seconds if seconds > 0 else CONNECT_TIMEOUT_SECONDS)


def public_location(url: str) -> str:
    """The URL without its password (for messages, /health and `cache stats`)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(url)
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


class PostgresCache(Store):
    """The cache in the PostgreSQL database at `url` (see the module doc); the schema is created on first use."""

    sql = STATEMENTS

    def __init__(self, url: str, pool_connections: int = POOL_CONNECTIONS):
        # psycopg is imported by the first PostgreSQL store, not with the package: a server on SQLite does not
        # pay for it (9.5 MB of memory per process, a tenth of a second at start-up).
        import psycopg

        # every error of psycopg and of its pool (PoolTimeout), and a value psycopg cannot encode (a lone
        # surrogate), which is not a psycopg.Error but fails the write as one does
        self._errors: tuple[type[Exception], ...] = (psycopg.Error, UnicodeEncodeError)
        self.url = url
        self._conninfo = connection_string(url)  # first: a URL it cannot parse is one line (CacheError)
        self.location = public_location(url)
        self._wait_seconds = wait_seconds(self._conninfo)
        self._pool_connections = pool_connections
        self._pool: AsyncConnectionPool | None = None
        self._pool_lock: asyncio.Lock | None = None
        self._checking: asyncio.Future | None = None  # the pool's check of its idle connections, when running
        self._pending_hits: dict[int, int] = {}  # entry id -> hits not written yet
        try:
            self._db = psycopg.connect(self._conninfo, autocommit=True)
        except self._errors as exc:
            raise CacheError(f"cannot open cache database {self.location}: {_one_line(exc)}") from None
        try:
            open_schema(self._db, self.location)
        except self._errors as exc:
            self._db.close()
            raise CacheError(f"cannot open cache database {self.location}: {_one_line(exc)}") from None
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------------ Store
    def _live(self) -> psycopg.Connection:
        """The plain connection, connected again if the server dropped it (a restart of PostgreSQL: the call
        that met the drop failed; this one goes on). /health uses it, so a server never stays unhealthy."""
        if self._db.broken:
            import psycopg

            logger.warning("cache database %s: connection lost, connecting again", self.location)
            try:
                self._db = psycopg.connect(self._conninfo, autocommit=True)
            except self._errors as exc:
                raise CacheError(f"cannot open cache database {self.location}: {_one_line(exc)}") from None
        return self._db

    def _execute(self, sql: str, parameters: Iterable[Any] = ()) -> psycopg.Cursor:
        try:
            return self._live().execute(sql, tuple(parameters))
        except self._errors as exc:  # one line for the CLI and /health, not a psycopg traceback
            raise CacheError(f"cache database {self.location}: {_one_line(exc)}") from None

    @contextlib.contextmanager
    def _transaction(self):
        try:
            with self._live().transaction():
                yield
        except self._errors as exc:  # one line for the CLI, as `_execute` says it
            raise CacheError(f"cache database {self.location}: {_one_line(exc)}") from None

    def _write_entries(self, entries: list[Entry]) -> int:
        return _write_entries(self._db, entries)

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
        keys = _keys(Call(category, tool, api, arguments, history))
        rows = self._live().execute(_FIND[len(keys)], keys).fetchall()
        return self._served(rows, identity, history, count_hit)

    def put_sessions(self, sessions: Iterable[Session]) -> int:
        stored, sessions = 0, iter(sessions)
        while chunk := list(itertools.islice(sessions, IMPORT_TRANSACTION_ROWS)):
            with self._transaction():
                for id_, digest, steps, lines, used in chunk:
                    stored += self._db.execute(
                        _NEW_SESSION, (session_key(id_), id_, digest, steps, lines, used)
                    ).rowcount
        return stored

    def stats(self) -> dict:
        stats = super().stats()
        stats["path"] = stats["location"]
        row = (
            self._live()
            .execute(
                "SELECT coalesce(sum(pg_total_relation_size(to_regclass(name))), 0) FROM unnest(%s::text[]) AS name",
                (list(TABLE_NAMES),),
            )
            .fetchone()
        )
        stats["bytes"] = int(row[0])  # type: ignore[index]  # an aggregate: always one row
        return stats

    def close(self) -> None:
        try:
            self.flush_hits()
        except CacheError as exc:  # the database is away: only hit counts are lost
            logger.warning("hit counts not written to %s: %s", self.location, _one_line(exc))
        except self._errors as exc:
            logger.warning("hit counts not written to %s: %s", self.location, _one_line(exc))
        finally:
            self._db.close()

    # ------------------------------------------------------------------------ the request path
    # Called on the server's event loop only.
    async def lookup(self, call: Call, identity: str, count_hit: bool = True) -> tuple[bytes, str] | None:
        keys = _keys(call)
        rows = await self._fetch(_FIND[len(keys)], keys)
        found = self._served(rows, identity, call.history, count_hit)
        return (found[0].encode(), found[1]) if found is not None else None

    async def store(self, entry: Entry, lease_holder: str | None = None) -> bool:
        row = _row(entry)
        async with self._connection() as db:
            if entry.identity and lease_holder is not None:  # what a server stores: one statement
                recorded = Call(entry.category, entry.tool, entry.api, entry.arguments).digest()
                return (
                    await db.execute(_STORE_SIMULATED, (row[0], entry.identity, lease_holder, *row, recorded))
                ).rowcount == 1
            async with db.transaction():
                if entry.identity:
                    recorded = Call(entry.category, entry.tool, entry.api, entry.arguments).digest()
                    stored = (await db.execute(_INSERT_SIMULATED, (*row, recorded))).rowcount == 1
                else:
                    stored = (await db.execute(_INSERT, row)).rowcount == 1
                    if stored:
                        await db.execute(_DROP_SHADOWED, row[1:5])
                if lease_holder is not None:
                    await db.execute(_RELEASE_LEASE, (row[0], entry.identity, lease_holder))
        return stored

    async def health_counts(self, idle_seconds: float) -> tuple[int, int, int]:
        rows = await self._fetch(_HEALTH_COUNTS, (time.time() - idle_seconds,))
        return rows[0][0], rows[0][1], rows[0][2]

    async def recorded_examples(self, category: str, tool: str, api: str, limit: int) -> list[tuple[str, str]]:
        return [tuple(row) for row in await self._fetch(_EXAMPLES, (category, tool, api, limit))]

    async def try_lease(self, call: Call, identity: str, holder: str, seconds: float) -> bool:
        now = time.time()
        async with self._connection() as db:
            return (await db.execute(_TAKE_LEASE, (call.digest(), identity, holder, now + seconds, now))).rowcount == 1

    async def release_lease(self, call: Call, identity: str, holder: str) -> None:
        async with self._connection() as db:
            await db.execute(_RELEASE_LEASE, (call.digest(), identity, holder))

    async def session(self, session_id: str, idle_seconds: float) -> SessionState | None:
        rows = await self._fetch(_SESSION, (session_key(session_id), time.time() - idle_seconds))
        return (rows[0][0], rows[0][1], json.loads(rows[0][2])) if rows else None

    async def update_session(self, session_id: str, idle_seconds: float, advance: Advance) -> SessionState:
        """The row is locked while it is read and written, so two servers given calls of one session at once both
        add theirs."""
        key = session_key(session_id)
        async with self._connection() as db:
            for _ in range(3):  # a new session that another server created at the same moment: read it
                async with db.transaction():
                    now = time.time()
                    row = await (await db.execute(_SESSION_FOR_UPDATE, (key,))).fetchone()
                    live = row is not None and row[3] >= now - idle_seconds
                    state = advance((row[0], row[1], json.loads(row[2])) if live else None)
                    values = (key, session_id, state[0], state[1], json.dumps(state[2], ensure_ascii=False), now)
                    if row is not None:
                        await db.execute(_PUT_SESSION, values)
                        return state
                    if (await db.execute(_NEW_SESSION, values)).rowcount == 1:
                        return state
        raise CacheError(f"session {session_id[:100]!r}: could not be updated (created concurrently again and again)")

    async def maintain(self, idle_seconds: float) -> None:
        """Hits are added in slices, in id order (servers never deadlock on each other)."""
        hits, self._pending_hits = self._pending_hits, {}
        ids = sorted(hits)  # one lock order for every server: concurrent flushes never deadlock
        try:
            async with self._connection() as db:
                for start in range(0, len(ids), HIT_FLUSH_ROWS):
                    rows = [(hits[id_], id_) for id_ in ids[start : start + HIT_FLUSH_ROWS]]
                    async with db.transaction(), db.cursor() as cursor:
                        await cursor.executemany(_COUNT_HITS, rows)
                now = time.time()
                for _ in range(FORGET_SESSIONS_BATCHES):
                    forgotten = await db.execute(_FORGET_SESSIONS, (now - idle_seconds, FORGET_SESSIONS_BATCH))
                    if forgotten.rowcount < FORGET_SESSIONS_BATCH:
                        break
                await db.execute(_FORGET_LEASES, (now,))
        except CacheError:
            for id_, n in hits.items():  # counted again next time
                self._pending_hits[id_] = self._pending_hits.get(id_, 0) + n
            raise

    async def aclose(self) -> None:
        """The pool closes after the hits are written, then the plain connection."""
        try:
            if self._pool is not None:
                with contextlib.suppress(CacheError):
                    await self.maintain(idle_seconds=float("inf"))
                await self._pool.close()
                self._pool = None
        finally:
            self.close()

    # ------------------------------------------------------------------------ connections
    @contextlib.asynccontextmanager
    async def _connection(self):
        """A pooled connection (autocommit: each statement, or `transaction()` block, commits); psycopg errors
        become CacheError, so that the server answers with an observation and goes on."""
        pool = self._pool or await self._open_pool()
        connection = None
        try:
            async with pool.connection() as connection:
                yield connection
        except self._errors as exc:
            if connection is not None and connection.broken and self._checking is None:
                # The server dropped it (a restart of PostgreSQL): the pool's other idle connections are likely
                # dropped too; check them now, in the background, rather than fail one request with each.
                self._checking = asyncio.ensure_future(pool.check())
                self._checking.add_done_callback(lambda _: setattr(self, "_checking", None))
            raise CacheError(f"cache database {self.location}: {_one_line(exc)}") from None

    async def _fetch(self, sql: str, parameters: tuple) -> list[tuple]:
        async with self._connection() as db:
            return await (await db.execute(sql, parameters)).fetchall()

    async def _open_pool(self) -> AsyncConnectionPool:
        from psycopg_pool import AsyncConnectionPool

        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if self._pool is None:
                pool = AsyncConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=self._pool_connections,
                    kwargs={"autocommit": True},
                    open=False,
                    name="mirrorapi-cache",
                    timeout=self._wait_seconds,  # a request's wait for a connection (module doc)
                )
                try:
                    await pool.open(wait=True, timeout=self._wait_seconds)
                except Exception as exc:
                    await pool.close()
                    raise CacheError(f"cannot open cache database {self.location}: {_one_line(exc)}") from None
                self._pool = pool
        return self._pool


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
