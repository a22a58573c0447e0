"""Response cache keys, the `ResponseCache` the server answers from, and its StableToolBench import/export.

One key function for the whole project: the canonical JSON of the arguments (sorted keys, compact,
UTF-8). The data builder deduplicates with it and the cache stores with it, so a call seen in
training and a call seen by the server are the same call.

StableToolBench's cache folder layout (notes §3) is `<cache>/<category>/<tool>_for_<category>/<api>.json`,
each file an object mapping the Python repr of an argument dict to `{"error", "response"}`.
`import_stabletoolbench_cache` reads it (repr keys map to canonical keys), `export_stabletoolbench_cache`
writes it back; `import_pairs` loads real pairs (our JSONL schema) with provenance `real`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import sqlite3
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


# ------------------------------------------------------------------------------- ResponseCache
SCHEMA_VERSION = 1
REAL = "real"
IMPORTED = "imported:"  # + origin (the folder or file name the entries came from)
SIMULATED = "simulated:"  # + <model>@<prompt format>
FEW_SHOT_PROVENANCE = f"(provenance = '{REAL}' OR provenance LIKE '{IMPORTED}%')"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    category TEXT NOT NULL, tool TEXT NOT NULL, api TEXT NOT NULL,
    arguments TEXT NOT NULL,              -- canonical_json of the argument object
    error TEXT NOT NULL,
    observation TEXT NOT NULL,            -- the whole {"error", "response"} answer, compact JSON
    provenance TEXT NOT NULL, created REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (category, tool, api, arguments)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS imports (
    origin TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, entries INTEGER NOT NULL, imported_at REAL NOT NULL);
"""
# A new entry never replaces a recorded one; a recorded (real or imported) one replaces a simulated one.
_UPSERT = """
INSERT INTO entries (category, tool, api, arguments, error, observation, provenance, created)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (category, tool, api, arguments) DO UPDATE SET
    error = excluded.error, observation = excluded.observation, provenance = excluded.provenance,
    created = excluded.created, hits = 0
WHERE entries.provenance LIKE 'simulated:%' AND excluded.provenance NOT LIKE 'simulated:%'
"""


class CacheError(Exception):
    """The cache database or a folder to import cannot be used; the message says which and why."""


class ResponseCache:
    """Responses keyed by (category, tool, api, canonical arguments), on SQLite in WAL mode.

    Every `put` is its own committed transaction, so a process killed at any moment leaves a
    database that opens with every entry committed before (WAL replays on open). Several processes
    may share the file (WAL readers never block; writers wait up to `busy_timeout` seconds).
    Hit counts are kept in memory and written by `flush_hits()` (the server flushes every few
    seconds and at shutdown), so a cache hit costs one indexed read and no write.
    """

    def __init__(self, path: str | os.PathLike, busy_timeout: float = 10.0, autocheckpoint: bool = True):
        self.path = Path(path)
        self._pending_hits: dict[tuple[str, str, str, str], int] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit, each statement (or explicit BEGIN block) one transaction.
            self._db = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes in WAL mode
            # Reads from a memory map, not a read() call per page: a third less CPU per lookup of a
            # 50 MB cache (20,000 entries, bench/server.py). Address space only; the OS shares the pages.
            self._db.execute("PRAGMA mmap_size=1073741824")
            if not autocheckpoint:  # the owner calls `checkpoint()` off the request path (see the server)
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise CacheError(f"{self.path}: cache schema version {row[0]}, this mirrorapi reads {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(f"cannot open cache database {self.path}: {exc}") from None

    # ------------------------------------------------------------------------ read and write
    def get(self, category: str, tool: str, api: str, arguments: str,
            count_hit: bool = True) -> tuple[str, str] | None:
        """(observation JSON, provenance) stored for canonical `arguments`, or None."""
        row = self._db.execute("SELECT observation, provenance FROM entries WHERE category = ? AND tool = ? "
                               "AND api = ? AND arguments = ?", (category, tool, api, arguments)).fetchone()
        if row is not None and count_hit:
            key = (category, tool, api, arguments)
            self._pending_hits[key] = self._pending_hits.get(key, 0) + 1
        return row

    def put(self, category: str, tool: str, api: str, arguments: str, error: str, response: Any,
            provenance: str) -> bool:
        """Store one answer (committed on return); False when an entry that wins is already there."""
        cursor = self._db.execute(_UPSERT, (category, tool, api, arguments, error,
                                            observation_json(error, response), provenance, time.time()))
        return cursor.rowcount > 0

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def put_many(self, rows: Iterable[tuple[str, str, str, str, str, Any]], provenance: str) -> int:
        """Store (category, tool, api, arguments, error, response) rows in one transaction; returns how many were new."""
        now = time.time()
        before = self._db.total_changes
        with self._transaction():
            self._db.executemany(_UPSERT, ((c, t, a, args, e, observation_json(e, r), provenance, now)
                                           for c, t, a, args, e, r in rows))
        return self._db.total_changes - before

    def examples(self, category: str, tool: str, api: str, limit: int = 256) -> list[tuple[str, str]]:
        """(arguments, observation) of recorded entries (real or imported, never simulated) of one API."""
        return self._db.execute(
            f"SELECT arguments, observation FROM entries WHERE category = ? AND tool = ? AND api = ? "
            f"AND {FEW_SHOT_PROVENANCE} ORDER BY arguments LIMIT ?", (category, tool, api, limit)).fetchall()

    def entries(self, provenance: Iterable[str] = ()) -> Iterator[tuple]:
        """(category, tool, api, arguments, observation, provenance) in key order; `provenance`: prefixes to keep."""
        prefixes = list(provenance)
        where = " OR ".join("provenance LIKE ?" for _ in prefixes) or "1"
        return self._db.execute(f"SELECT category, tool, api, arguments, observation, provenance FROM entries "
                                f"WHERE {where} ORDER BY category, tool, api, arguments",
                                [p + "%" for p in prefixes])

    def flush_hits(self, limit: int | None = None) -> int:
        """Write counted hits (at most `limit` entries' worth); returns how many entries are still pending."""
        if not self._pending_hits:
            return 0
        keys = list(itertools.islice(self._pending_hits, limit)) if limit else list(self._pending_hits)
        with self._transaction():
            self._db.executemany("UPDATE entries SET hits = hits + ? WHERE category = ? AND tool = ? AND api = ? "
                                 "AND arguments = ?", ((self._pending_hits[key], *key) for key in keys))
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
        totals = self._db.execute("SELECT count(*), coalesce(sum(hits), 0), count(DISTINCT category || '/' || tool "
                                  "|| '/' || api), sum(error != '') FROM entries").fetchone()
        imports = [{"origin": o, "entries": n, "imported_at": t} for o, n, t in
                   self._db.execute("SELECT origin, entries, imported_at FROM imports ORDER BY imported_at")]
        return {"path": str(self.path), "entries": totals[0], "apis": totals[2], "errors": totals[3] or 0,
                "hits": totals[1], "by_provenance": by_provenance, "imports": imports,
                "bytes": sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file())}

    def close(self) -> None:
        try:
            self.flush_hits()
        finally:
            self._db.close()


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
        rows.append((*resolved[names][0], canonical_json(pair["tool_input"]), response["error"], response["response"]))
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


def export_stabletoolbench_cache(cache: ResponseCache, folder: str | os.PathLike,
                                 provenance: Iterable[str] = ()) -> dict:
    """Write the cache (or the entries whose provenance starts with one of `provenance`) as a
    StableToolBench cache folder. Files of the APIs written are replaced; other files are left alone.
    Keys are `str(arguments)` as StableToolBench writes them (sorted, since arguments are canonical)."""
    folder = Path(folder)
    files = entries = 0
    for (category, tool, api), rows in itertools.groupby(cache.entries(provenance), key=lambda row: row[:3]):
        content = {str(json.loads(row[3])): json.loads(row[4]) for row in rows}
        _write_json_atomically(folder / category / f"{tool}_for_{category}" / f"{api}.json", content)
        files, entries = files + 1, entries + len(content)
    return {"folder": str(folder), "files": files, "entries": entries}
