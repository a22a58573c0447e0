"""The SQLite store's writer on a server (`LoopWriter`): the writes of one event-loop turn committed together,
on the loop, on a connection that never waits for SQLite's lock (the module doc of `sqlite` says why)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from mirrorapi.serving.cache.entries import CacheError

logger = logging.getLogger(__name__)


class Failed:
    """What a job that raised leaves for its caller (a result of its own, as a job may return anything)."""

    def __init__(self, error: Exception):
        self.error = error


class LoopWriter:
    """The writes of a server, committed on the event loop: the jobs handed over in one loop turn run in
    one transaction right after it. The connection does not wait for SQLite's lock: when another process
    holds it, the commit is tried again every POLL_SECONDS (SQLite's own busy handler sleeps up to 100 ms
    between tries, long enough for an importer to take the lock again and again; polling every
    millisecond gets in between the importer's slices). No job handed over is dropped."""

    POLL_SECONDS = 0.001

    def __init__(self, db: sqlite3.Connection, committed: Callable[[], None] | None = None):
        """`committed`: called after each commit (on the loop)."""
        self._db = db
        self._committed = committed
        self._jobs: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future]] = []
        self._scheduled: asyncio.Handle | None = None
        self._waiting_since: float | None = None
        self._reported = 0.0

    def submit(self, job: Callable[[sqlite3.Connection], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.append((job, future))
        if self._scheduled is None:
            self._scheduled = loop.call_soon(self._commit)
        return future

    async def drain(self) -> None:
        while self._jobs:
            await asyncio.gather(*(future for _, future in self._jobs), return_exceptions=True)

    def close(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
        self._db.close()

    def _commit(self) -> None:
        self._scheduled = None
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return self._retry_later()
            return self._fail(self._take(), exc)
        jobs = self._take()
        try:
            outcomes = [self._run(job) for job, _ in jobs]
            self._db.execute("COMMIT")
        except Exception as exc:  # the transaction's own failure (a full disk): never leave it open or a future
            # unanswered, or every later write of the server fails ("within a transaction")
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            return self._fail(jobs, exc)
        self._waiting_since = None
        failed = [(job, outcome) for job, outcome in zip(jobs, outcomes, strict=True) if isinstance(outcome, Failed)]
        for job, outcome in failed:
            self._fail([job], outcome.error)
        for (_, future), outcome in zip(jobs, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)
        if self._committed is not None:
            self._committed()

    def _run(self, job: Callable[[sqlite3.Connection], Any]) -> Any:
        """One job in a savepoint of the turn's transaction: a job that raises (an answer that cannot be encoded)
        has its own writes undone and fails alone; the other requests' writes of the same turn commit (they once
        all failed with it)."""
        self._db.execute("SAVEPOINT job")
        try:
            result = job(self._db)
        except Exception as exc:
            self._db.execute("ROLLBACK TO job")
            self._db.execute("RELEASE job")
            return Failed(exc)
        self._db.execute("RELEASE job")
        return result

    def _take(self) -> list:
        jobs, self._jobs = self._jobs, []
        return jobs

    def _retry_later(self) -> None:
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since, self._reported = now, 0.0
        elif now - self._waiting_since - self._reported >= 10.0:
            self._reported = now - self._waiting_since
            logger.warning(
                "cache writes wait for the database lock (another connection holds it, e.g. an import; "
                "%.0f s so far); %d writes queued, none dropped",
                self._reported,
                len(self._jobs),
            )
        self._scheduled = asyncio.get_running_loop().call_later(self.POLL_SECONDS, self._commit)

    @staticmethod
    def _fail(jobs: list, exc: Exception) -> None:
        logger.error("cache write failed: %s (%d writes)", exc, len(jobs))
        for _, future in jobs:
            if not future.done():
                future.set_exception(CacheError(f"cache write failed: {exc}"))
