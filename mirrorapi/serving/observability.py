"""What the virtual server tells about itself: Prometheus metrics (`ServerMetrics`, served at /metrics)
and the request log (`RequestLogWriter`: one JSON line per /virtual request).

A request log line: `time`, `outcome` (the metrics label), `status`, `api` (category/tool/api),
`provenance` (where the answer came from), `ms`; `engine_ms` and `coalesced` when the engine was
asked; `detail` of a failure; `extra_fields` of the body that StableToolBench does not define;
`session` when the call belongs to a simulation session; `rationale` of a CoT-mode simulation
(prompt format stabletoolbench-cot: the model's `mechanism_of_the_api`, which the agent does not see).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily

from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.handler import Answer

logger = logging.getLogger(__name__)

STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                 30, 60, 120)


class ServerMetrics:
    """Prometheus metrics of one app (own registry, so several apps can live in one process). `state`:
    the app's state, whose `simulator` (set when the app starts) is read when /metrics is scraped."""

    def __init__(self, state: Any):
        self.registry = CollectorRegistry()
        self.requests = Counter("mirrorapi_requests", "/virtual requests by outcome (hit, simulated, replay_miss, "
                                "validation_error, engine_error, chat_with_user, invalid_body, internal_error).",
                                ["outcome"], registry=self.registry)
        self.lookups = Counter("mirrorapi_cache_lookups", "Cache lookups by result (hit, miss).", ["result"],
                               registry=self.registry)
        self.stages = Histogram("mirrorapi_stage_seconds", "Latency of each stage of a /virtual request (parse, "
                                "resolve, cache_lookup, engine, total).", ["stage"], buckets=STAGE_BUCKETS,
                                registry=self.registry)
        self.registry.register(_SimulatorCollector(state))
        # Children bound once: `labels()` per request costs more than the observation itself.
        self._requests, self._lookups, self._stages = {}, {}, {}

    def record(self, answer: Answer) -> None:
        counter = self._requests.get(answer.outcome) or self._requests.setdefault(
            answer.outcome, self.requests.labels(answer.outcome))
        counter.inc()
        if answer.cache:
            counter = self._lookups.get(answer.cache) or self._lookups.setdefault(
                answer.cache, self.lookups.labels(answer.cache))
            counter.inc()
        for stage, seconds in answer.stages.items():
            histogram = self._stages.get(stage) or self._stages.setdefault(stage, self.stages.labels(stage))
            histogram.observe(seconds)


class _SimulatorCollector:
    """Engine calls by result and coalesced requests, read from the simulator when scraped."""

    def __init__(self, state: Any):
        self.state = state

    def collect(self):
        calls = CounterMetricFamily("mirrorapi_engine_calls", "Engine calls by result (ok, garbage, "
                                    "empty, unreachable, timeout, http, not_json, no_choice).", labels=["result"])
        coalesced = CounterMetricFamily("mirrorapi_coalesced_requests", "Cache misses answered by an identical "
                                        "engine call already in flight.")
        simulator = getattr(self.state, "simulator", None)
        if simulator is not None:
            for result, n in sorted(simulator.engine_calls.items()):
                calls.add_metric([result], n)
            coalesced.add_metric([], simulator.coalesced)
        yield calls
        yield coalesced


class RequestLogWriter:
    """One JSON line per /virtual request, to stderr (at log level info or debug) and to `log_file`.
    Why not the `logging` module: a log record and its handler chain cost more than the line itself,
    and a stream handler writes and flushes per record; together about 50 us of a cache hit's 250 us
    of server CPU (bench/server.py). Here the lines of one event-loop turn are written together right
    after it (at once outside a loop, or when 1,024 are waiting), and `close` writes what is left."""

    def __init__(self, settings: ServerSettings):
        self.streams = [sys.stderr] if settings.log_level in ("debug", "info") else []
        if settings.log_file is not None:
            settings.log_file.parent.mkdir(parents=True, exist_ok=True)
            self.streams.append(open(settings.log_file, "a", encoding="utf-8"))
        self.lines: list[str] = []

    def record(self, answer: Answer) -> None:
        if not self.streams:
            return
        line = {"time": round(time.time(), 3), "outcome": answer.outcome, "status": answer.status,
                "api": "/".join(answer.names) if answer.names else None, "provenance": answer.provenance,
                "ms": round(answer.stages.get("total", 0.0) * 1000, 3)}
        if "engine" in answer.stages:
            line["engine_ms"] = round(answer.stages["engine"] * 1000, 1)
            line["coalesced"] = answer.coalesced
        if answer.parsed:  # how the model's text was read: json (as written), fenced, literal, regex, repaired
            line["parsed"] = answer.parsed
        if answer.detail:
            line["detail"] = answer.detail[:300]
        if answer.extra_fields:
            line["extra_fields"] = answer.extra_fields
        if answer.session is not None:
            line["session"] = answer.session[:80]
        if answer.rationale:
            line["rationale"] = answer.rationale[:4000]
        self.lines.append(json.dumps(line, ensure_ascii=False))
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
            text = "\n".join(lines) + "\n"
            for stream in self.streams:
                try:
                    stream.write(text)
                    stream.flush()
                except (OSError, ValueError) as exc:  # a full disk or a closed stderr must not fail requests
                    logger.warning("request log lines lost: %s", exc)

    def close(self) -> None:
        self.flush()
        for stream in self.streams:
            if stream is not sys.stderr:
                stream.close()
