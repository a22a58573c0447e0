"""What the virtual server tells about itself: Prometheus metrics (`ServerMetrics`, served at /metrics)
and the request log (`RequestLogWriter`: one JSON line per /virtual request).

With several worker processes (`workers`), the metrics are prometheus-client's multiprocess mode (every
process writes its values to files in PROMETHEUS_MULTIPROC_DIR, which the server sets before it starts
them; /metrics adds them up), and every process appends its lines to the same request log, whole lines
in one write() each (O_APPEND), so the log is one file of whole lines.

A request log line: `time`, `outcome` (the metrics label), `status`, `api` (category/tool/api),
`provenance` (where the answer came from), `ms`; `engine_ms` and `coalesced` when the engine was
asked; `parsed` (how the model's text was read) and `second_try` (an answer cut at `max_tokens` asked
again: kept, cut again, failed) of a simulation; `asked_alone` (true) of a session call whose simulated failure the
`session_failure_rule` checked (no related call to cause it; or, under `alone`, any) and answered as the call alone;
`detail` of a failure;
`extra_fields` of the body that StableToolBench does not define;
`session` when the call belongs to a simulation session; `rationale` of a CoT-mode simulation
(prompt format stabletoolbench-cot: the model's `mechanism_of_the_api`, which the agent does not see).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from mirrorapi.serving.answer import ANSWERED, REFUSED, Answer
from mirrorapi.serving.config import ConfigError, ServerSettings

logger = logging.getLogger(__name__)
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps with arguments builds an encoder per call
_STRING = json.encoder.encode_basestring  # a str as a JSON string, as _ENCODE writes it

STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)


class ServerMetrics:
    """Prometheus metrics of one app (own registry, so several apps can live in one process; in multiprocess
    mode /metrics reads every process's files instead)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "mirrorapi_requests",
            f"/virtual requests by outcome ({', '.join(ANSWERED)}), and the refusals of any path answered "
            f"before a handler ({', '.join(REFUSED)}).",
            ["outcome"],
            registry=self.registry,
        )
        self.lookups = Counter(
            "mirrorapi_cache_lookups", "Cache lookups by result (hit, miss).", ["result"], registry=self.registry
        )
        self.stages = Histogram(
            "mirrorapi_stage_seconds",
            "Latency of each stage of a /virtual request (parse, resolve, cache_lookup, engine, total).",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.engine_calls = Counter(
            "mirrorapi_engine_calls",
            "Engine calls by result (ok, garbage, empty, unreachable, timeout, http, not_json, no_choice, busy).",
            ["result"],
            registry=self.registry,
        )
        self.second_tries = Counter(
            "mirrorapi_second_tries",
            "Simulated answers cut at max_tokens and asked again, by what came of it (kept, cut again, failed).",
            ["result"],
            registry=self.registry,
        )
        self.coalesced_requests = Counter(
            "mirrorapi_coalesced_requests",
            "Cache misses answered by an identical engine call already in flight.",
            registry=self.registry,
        )
        # Children bound once: `labels()` per request costs more than the observation itself.
        self._requests, self._lookups, self._stages = {}, {}, {}

    def record(self, answer: Answer) -> None:
        counter = self._requests.get(answer.outcome) or self._requests.setdefault(
            answer.outcome, self.requests.labels(answer.outcome)
        )
        counter.inc()
        if answer.cache:
            counter = self._lookups.get(answer.cache) or self._lookups.setdefault(
                answer.cache, self.lookups.labels(answer.cache)
            )
            counter.inc()
        for stage, seconds in answer.stages.items():
            histogram = self._stages.get(stage) or self._stages.setdefault(stage, self.stages.labels(stage))
            histogram.observe(seconds)

    def engine_call(self, result: str) -> None:
        self.engine_calls.labels(result).inc()

    def second_try(self, result: str) -> None:
        self.second_tries.labels(result).inc()

    def coalesced(self) -> None:
        self.coalesced_requests.inc()

    def exposition(self) -> tuple[bytes, str]:
        """The /metrics body and its content type: this process's metrics, or all processes' in multiprocess mode."""
        registry = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8"


class RequestLogWriter:
    """One JSON line per /virtual request, to stderr (at log level info or debug) and to `log_file`.
    Why not the `logging` module: a log record and its handler chain cost more than the line itself,
    and a stream handler writes and flushes per record; together about 50 us of a cache hit's 250 us
    of server CPU (bench/server.py). Here the lines of one event-loop turn are written together right
    after it (at once outside a loop, or when 1,024 are waiting), one write() per file, and `close`
    writes what is left."""

    def __init__(self, settings: ServerSettings):
        self.files = [2] if settings.log_level in ("debug", "info") else []  # stderr
        self._own: list[int] = []
        self.path = settings.log_file
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:  # a user's setting: one line at start, not a traceback
                raise ConfigError(f"log_file: cannot open {self.path} to append to ({exc.strerror})") from None
            self.files.append(fd)
            self._own.append(fd)
        self.lines: list[str] = []

    def reopen(self) -> None:
        """Write what is pending, then open `log_file` again by its name: after logrotate moved it away, the lines
        go to a new file of that name (the server's SIGHUP, which a logrotate `postrotate` sends; it stopped the
        server). Kept on the old file when the name cannot be opened."""
        self.flush()
        if self.path is None or not self._own:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            logger.warning("log_file: cannot open %s again (%s): lines go on to the file as it was", self.path, exc)
            return
        old = self._own[0]
        self.files[self.files.index(old)], self._own = fd, [fd]
        os.close(old)
        logger.info("log_file %s opened again", self.path)

    def record(self, answer: Answer) -> None:
        if not self.files:
            return
        # The fields of every line written out directly (half the CPU of a dict through the JSON encoder);
        # the fields only some lines have, through the encoder.
        api = _STRING("/".join(answer.names)) if answer.names else "null"
        provenance = _STRING(answer.provenance) if answer.provenance is not None else "null"
        line = (
            f'{{"time": {round(time.time(), 3)!r}, "outcome": {_STRING(answer.outcome)}, "status": {answer.status}, '
            f'"api": {api}, "provenance": {provenance}, "ms": {round(answer.stages.get("total", 0.0) * 1000, 3)!r}'
        )
        more: dict = {}
        if "engine" in answer.stages:
            more["engine_ms"] = round(answer.stages["engine"] * 1000, 1)
            more["coalesced"] = answer.coalesced
        if answer.parsed:  # how the model's text was read: json (as written), fenced, literal, regex, repaired
            more["parsed"] = answer.parsed
        if answer.second_try:
            more["second_try"] = answer.second_try
        if answer.asked_alone:
            more["asked_alone"] = True
        if answer.detail:
            more["detail"] = answer.detail[:300]
        if answer.extra_fields:
            more["extra_fields"] = answer.extra_fields
        if answer.session is not None:
            more["session"] = answer.session[:80]
        if answer.rationale:
            more["rationale"] = answer.rationale[:4000]
        self.lines.append(line + ", " + _ENCODE(more)[1:] if more else line + "}")
        if len(self.lines) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
                return
            except RuntimeError:  # no event loop in this thread
                pass
        elif len(self.lines) < 1024:
            return
        self.flush()

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        if lines:
            # A lone surrogate (a CoT model's rationale may hold half an escape pair) is inside a JSON string, where
            # backslashreplace writes it as its JSON escape: the line stays UTF-8 and reads back as it was.
            data = ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
            for fd in self.files:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError as exc:  # a full disk or a closed stderr must not fail requests
                    logger.warning("request log lines lost: %s", exc)

    def close(self) -> None:
        self.flush()
        for fd in self._own:
            os.close(fd)
        self._own = []
