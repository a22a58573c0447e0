"""The response cache the server answers from, on SQLite (embedded, the default) or PostgreSQL (shared by
servers on many hosts): the same schema, the same rules (`base`), one `open_cache` for both.

- `entries`: what an entry is and which one serves a call;
- `store`: `Store`, the interface every store implements, declared once (the request path and the
  administrative side);
- `sqlite`: `ResponseCache`, the cache in one SQLite file (its schema: `sqlite_schema`; the server's writer:
  `sqlite_writer`); `postgres`: `PostgresCache`, on PostgreSQL (`cache_url`; its schema: `postgres_schema`);
- `folders`: StableToolBench cache folders and real pairs in and out of either.

One key function for the whole project: the canonical JSON of the arguments (sorted keys, compact,
UTF-8; `mirrorapi.records.canonical_json`). The data builder deduplicates with it and the cache stores
with it, so a call seen in training and a call seen by the server are the same call.
"""

from __future__ import annotations

import os
import re

from mirrorapi.serving.cache.entries import (
    IMPORTED,
    NO_SESSION,
    REAL,
    RECORDED,
    SCHEMA_VERSION,
    SIMULATED,
    CacheError,
    Call,
    Entry,
    identity_of,
    lease_holder,
    new_entry,
)
from mirrorapi.serving.cache.folders import (
    export_identity,
    export_stabletoolbench_cache,
    import_pairs,
    import_stabletoolbench_cache,
    unsafe_name,
)
from mirrorapi.serving.cache.postgres import PostgresCache
from mirrorapi.serving.cache.sqlite import ResponseCache
from mirrorapi.serving.cache.store import Store

__all__ = [
    "IMPORTED",
    "NO_SESSION",
    "REAL",
    "RECORDED",
    "SCHEMA_VERSION",
    "SIMULATED",
    "CacheError",
    "Call",
    "Entry",
    "PostgresCache",
    "ResponseCache",
    "Store",
    "copy_cache",
    "export_identity",
    "export_stabletoolbench_cache",
    "identity_of",
    "import_pairs",
    "import_stabletoolbench_cache",
    "is_url",
    "lease_holder",
    "new_entry",
    "open_cache",
    "sqlite_path",
    "unsafe_name",
]


def is_url(location: str | os.PathLike) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def open_cache(location: str | os.PathLike, **options) -> Store:
    """The cache at `location`: a `postgresql://` URL, or the path of a SQLite file (created if missing;
    `sqlite:///PATH` names one too, see `sqlite_path`). `options`: the SQLite store's (ignored for PostgreSQL)."""
    if is_url(location):
        return PostgresCache(str(location))
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", str(location)) and not str(location).startswith("sqlite:///"):
        # a URL of another kind (postgresql+psycopg://, a typo of postgresql://) once made a SQLite file of that name
        raise CacheError(
            f"cache location {str(location).split('://')[0]}://... is neither a postgresql:// URL nor a SQLite path"
        )
    return ResponseCache(sqlite_path(location), **options)


def sqlite_path(location: str | os.PathLike) -> str:
    """The file a SQLite location names: a path, or a URL as SQLAlchemy writes them (`sqlite:///relative/path`,
    `sqlite:////absolute/path`)."""
    location = str(location)
    return location[len("sqlite:///") :] if location.startswith("sqlite:///") else location


def copy_cache(source: Store, destination: Store) -> dict:
    """Copy every entry, session and import record of `source` into `destination` (e.g. SQLite ->
    PostgreSQL), by the cache's rules: what `destination` already holds wins. Run it again after an
    interruption: nothing doubles. Returns counts."""
    entries = destination.put_entries(source.rows())
    sessions = destination.put_sessions(source.sessions())
    for origin, fingerprint, n, _ in source.imports():
        if destination.import_fingerprint(origin) is None:
            destination.record_import(origin, fingerprint, n)
    return {
        "from": source.location,
        "to": destination.location,
        "entries_read": source.count(),
        "entries_copied": entries,
        "sessions_copied": sessions,
    }
