"""The virtual API server: `create_app(settings)` and `serve(settings)`; wiring only.

Routes: `POST /virtual` (StableToolBench's contract, see `mirrorapi.serving.protocol`; the work is done by
`mirrorapi.serving.handler.VirtualApi`), `GET /health` (whether misses can be simulated: 200 `ok` or
`degraded`, 503 `unavailable`; cache size), `GET /live` (200 once the server answers), `GET /metrics`
(Prometheus: requests by outcome, cache hits and misses, engine calls, latency per stage), and `/mcp`
(the Model Context Protocol over streamable HTTP, `mirrorapi.serving.mcp_server`; its tool calls
take the /virtual path). /virtual stays the first thing the ASGI app checks, so /mcp costs it nothing.
Every /virtual request writes one JSON line (`RequestLogWriter`: stderr at log level info, and `log_file`);
metrics and the request log live in `mirrorapi.serving.observability`.

`create_app` loads the tools and opens the cache (importing `cache_folder` once) before anything
listens, so a bad tools file or cache fails at start-up in one line; the lifespan creates the engine
client and reports whether the engine answers. The server starts, and serves cache hits, even when
the engine is not reachable yet (vLLM can take minutes to load a model).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import tempfile
import urllib.parse

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from mirrorapi.engine_client import EngineClient
from mirrorapi.serving.cache import (
    CacheError,
    SqlCache,
    import_stabletoolbench_cache,
    is_url,
    lease_holder,
    open_cache,
)
from mirrorapi.serving.config import ConfigError, ServerSettings
from mirrorapi.serving.handler import VirtualApi
from mirrorapi.serving.mcp_server import MCP_PATH, McpFrontDoor
from mirrorapi.serving.observability import RequestLogWriter, ServerMetrics
from mirrorapi.serving.protocol import OUTCOME_HEADER, PROVENANCE_HEADER, SESSION_HEADER
from mirrorapi.serving.simulator import Simulator
from mirrorapi.serving.transport import (
    UNAUTHORIZED,
    BodyTooLarge,
    ClientGone,
    ReceiveDeadline,
    RequestDeadlineMiddleware,
    authorized,
    error_body,
    guard,
    read_body,
    send_json,
    uvicorn_options,
)
from mirrorapi.tools import ToolRegistry
from mirrorapi.toolsets import ToolsetError, select_toolset

logger = logging.getLogger(__name__)

CACHE_MAINTENANCE_SECONDS = 5.0
OPEN_PATHS = ("/health", "/live")  # answered without the server's API key (probes of orchestrators)
# The settings of the worker processes (`serve_workers`), as JSON: uvicorn starts them by importing a factory.
WORKER_SETTINGS_ENV = "_MIRRORAPI_WORKER_SETTINGS"


class VirtualEndpoint:
    """`/virtual` as the outermost ASGI app, in front of the FastAPI app that serves everything else
    (the API key, the 405 and the 413 of every path are answered here too, in the `{"error", "response"}`
    shape). Why not a FastAPI route: measured side by side (bench/server.py runs bench/virtual_route.py, the
    same server with /virtual as a route with typed dependencies, beside this one), a cache hit through the
    route costs 4.9 times the server CPU (0.378 ms against 0.076 ms, 64 clients, 2 cores, 2026-11-26), where
    issue 19 allowed 10% more. `answer` turns every failure into a response, so nothing is lost by bypassing
    Starlette's error middleware."""

    def __init__(self, app: FastAPI):
        self.app, self.state = app, app.state
        settings = app.state.settings
        self.api_key = settings.server_api_key.encode() if settings.server_api_key else None
        self.max_body = settings.max_body_bytes
        self.others = RequestDeadlineMiddleware(self.dispatch)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if self.api_key is not None and path not in OPEN_PATHS and not authorized(scope, self.api_key):
            guard(scope).received()
            return await send_json(send, 401, error_body(UNAUTHORIZED), [(b"www-authenticate", b"Bearer")])
        if path != "/virtual":
            return await self.others(scope, receive, send)
        deadline = guard(scope)
        if scope["method"] != "POST":
            deadline.received()
            return await send_json(send, 405, error_body("Method Not Allowed: /virtual takes POST"),
                                   [(b"allow", b"POST")])
        try:
            body = await read_body(scope, receive, self.max_body)
        except BodyTooLarge as exc:
            deadline.received()
            message = (f"Request body too large: {exc.args[0]:,} bytes or more (this server takes up to "
                       f"{self.max_body:,})")
            return await send_json(send, 413, error_body(message), [(b"connection", b"close")])
        except ClientGone:
            return
        deadline.received()
        session_id = None
        for name, value in scope["headers"]:
            if name == SESSION_HEADER:
                session_id = value.decode("latin-1")
                break
        state = self.state
        answer = await state.virtual.answer(body, session_id)
        await send_json(send, answer.status, answer.body, answer_headers(answer.outcome, answer.provenance))
        state.metrics.record(answer)
        state.request_log.record(answer)

    async def dispatch(self, scope, receive, send) -> None:
        if scope["path"].rstrip("/") == MCP_PATH:
            return await self.state.mcp.asgi(scope, receive, send)
        return await self.app(scope, receive, send)


PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7f) if chr(c) != "%")  # what a header value may hold as is


@functools.lru_cache(maxsize=1024)  # a server gives a handful of outcomes and provenances, over and over
def answer_headers(outcome: str, provenance: str | None) -> list[tuple[bytes, bytes]]:
    """The headers that say how a /virtual call was answered (`mirrorapi.serving.protocol`)."""
    headers = [(OUTCOME_HEADER, outcome.encode("ascii"))]
    if provenance is not None:
        headers.append((PROVENANCE_HEADER, urllib.parse.quote(provenance, safe=PRINTABLE).encode("ascii")))
    return headers


async def _maintain_cache(cache: SqlCache, session_ttl: float) -> None:
    """Every few seconds: write the counted hits, forget idle sessions and expired leases, checkpoint."""
    while True:
        await asyncio.sleep(CACHE_MAINTENANCE_SECONDS)
        try:
            await cache.maintain(session_ttl)
        except CacheError as exc:  # e.g. the database is away for a moment: next time
            logger.warning("cache maintenance postponed: %s", exc)


async def _report_engine(engine: EngineClient) -> None:
    """One line per replica at start-up: whether it serves the configured model."""
    for replica in await engine.health():
        if replica.ok:
            logger.info("engine %s serves model %r (%s)", replica.base_url, engine.model, replica.detail)
        elif replica.reachable:
            logger.warning("engine %s %s: fix `model` (or `api_base`); misses get an error observation until "
                           "it does", replica.base_url, replica.detail)
        else:
            logger.warning("engine %s is not reachable yet (%s): cache hits are served, misses get an error "
                           "observation until it answers", replica.base_url, replica.detail)


def open_server_cache(settings: ServerSettings) -> SqlCache:
    """The cache a server answers from: PostgreSQL at `cache_url`, else the SQLite file `cache_path` (checkpointed
    by the server's maintenance, off the request path)."""
    if settings.cache_url:
        return open_cache(settings.cache_url)
    return open_cache(settings.cache_path, autocheckpoint=False)


def create_app(settings: ServerSettings) -> VirtualEndpoint:
    """The ASGI app (`.app`: the FastAPI app behind /virtual; `.state`: its state). Raises
    RegistryError / CacheError (one line each) when the tools or the cache cannot be used."""
    for warning in settings.startup_warnings():
        logger.warning("%s", warning)
    registry = ToolRegistry.load(settings.tools_folder)
    stats = registry.stats()
    logger.info("tools: %d categories, %d tools, %d APIs loaded in %.2f s (%d unreadable files skipped; compiled "
                "index: %s)", stats["categories"], stats["tools"], stats["apis"], stats["load_seconds"],
                stats["unreadable"], ", ".join(stats["indexes"]) or "none")
    cache = open_server_cache(settings)
    if settings.cache_folder is not None:
        import_stabletoolbench_cache(cache, settings.cache_folder, registry=registry)
    try:  # the configured MCP toolset must name known APIs: checked before anything listens
        toolset = select_toolset(registry, settings.mcp_toolset)
    except ToolsetError as exc:
        raise ConfigError(f"mcp_toolset: {exc}") from None
    logger.info("MCP at %s: %d tools in the default toolset", MCP_PATH, len(toolset.functions))
    logger.info("cache %s: %d entries", cache.location, cache.count())
    # The tool docs are millions of long-lived objects: keep them out of the garbage collector's
    # full passes, which otherwise stall every request for a hundred milliseconds now and then.
    gc.freeze()
    # Servers that share the store simulate a call once between them (a lease per call in the store).
    shared = settings.workers > 1 or is_url(settings.cache_url or "")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = EngineClient(settings.api_base, settings.model, settings.api_key, timeout=settings.engine_timeout,
                              attempt_timeout=settings.attempt_timeout(), retries=settings.engine_retries,
                              cooldown=settings.engine_cooldown, max_in_flight=settings.engine_max_in_flight,
                              max_waiting=settings.engine_max_waiting)
        if settings.mode == "simulate":
            logger.info("%s", settings.attempt_timeout_reason())
        simulator = Simulator(engine, cache, settings)
        app.state.engine = engine
        app.state.virtual = virtual = VirtualApi(settings, registry, cache, simulator, app.state.metrics,
                                                 lease_holder() if shared else None)
        logger.info("simulator identity (simulated answers are looked up and stored under it): %s",
                    virtual.responder.identities[False])
        background = [asyncio.create_task(_maintain_cache(cache, settings.session_ttl))]
        if settings.mode == "simulate":  # probed in the background: a hanging engine must not delay start-up
            background.append(asyncio.create_task(_report_engine(engine)))
        try:
            async with app.state.mcp.run():
                yield
        finally:
            for task in background:
                task.cancel()
            # Simulations outlive requests whose client went away; their answers are stored before the cache closes.
            await virtual.responder.drain(timeout=settings.engine_timeout + 5)
            app.state.request_log.close()
            await cache.aclose()  # after everything handed to it is committed
            await engine.aclose()

    # FastAPI's OpenTelemetry hooks are off: /metrics is the server's telemetry, and the check costs
    # environment lookups on every request.
    app = FastAPI(title="mirrorapi virtual API server", lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.settings, app.state.registry, app.state.cache = settings, registry, cache
    app.state.metrics = ServerMetrics()
    app.state.request_log = RequestLogWriter(settings)
    app.state.mcp = McpFrontDoor(app.state)

    @app.get("/live")
    async def live() -> JSONResponse:
        """200 as soon as the server answers HTTP (readiness polls, liveness probes); /health says more."""
        return JSONResponse({"status": "live"})

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 `ok` (every replica serves the model, or replay mode), 200 `degraded` (some do), 503
        `unavailable` (none: misses cannot be simulated; cache hits are still served)."""
        engines = [] if settings.mode == "replay" else await app.state.engine.health(timeout=2.0)
        serving = sum(e.ok for e in engines)
        try:
            entries, open_sessions, session_entries = await cache.health_counts(settings.session_ttl)
        except CacheError as exc:  # the shared store is away: hits fail too; say so rather than answer 500
            return JSONResponse(status_code=503, content={
                "status": "unavailable", "misses": "not answered: the cache cannot be read", "detail": str(exc),
                "mode": settings.mode, "model": settings.model, "cache": {"location": cache.location}})
        if settings.mode == "replay":
            status, misses = "ok", "answered from the cache only (replay mode)"
        elif serving == len(engines):
            status, misses = "ok", "simulated"
        elif serving:
            status, misses = "degraded", f"simulated by {serving} of {len(engines)} engine replicas"
        else:
            status, misses = "unavailable", ("not simulated: no engine replica serves the model; cache hits are "
                                             "still served, misses get an error observation")
        return JSONResponse(status_code=503 if status == "unavailable" else 200, content={
            "status": status, "misses": misses, "mode": settings.mode, "model": settings.model,
            "prompt_format": settings.prompt_format,
            "engine": [{"base_url": e.base_url, "reachable": e.reachable, "serves_model": e.ok, "detail": e.detail,
                        "cooling_down_s": e.cooling_down} for e in engines],
            "cache": {"location": cache.location, "entries": entries},
            "tools": {k: stats[k] for k in ("categories", "tools", "apis")},
            "sessions": {"open": open_sessions, "history": settings.session_history,
                         "cache_entries": session_entries},
        })

    @app.get("/metrics")
    async def metrics() -> Response:
        body, media_type = app.state.metrics.exposition()
        return Response(body, media_type=media_type)

    return VirtualEndpoint(app)


def configure_logging(settings: ServerSettings) -> None:
    """Logging of the server process (start-up, engine and cache events; request lines are `RequestLogWriter`'s)."""
    logging.basicConfig(level=getattr(logging, settings.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(settings: ServerSettings) -> None:
    """Build the app and run uvicorn until interrupted (raises RegistryError / CacheError at start-up); with
    `workers` > 1, uvicorn's worker processes (`serve_workers`)."""
    configure_logging(settings)
    logger.info("settings (not default): %s", {k: v for k, v in settings.non_default().items()
                                               if k not in ("api_key", "server_api_key")})
    if settings.workers > 1:
        return serve_workers(settings)
    app = create_app(settings)
    uvicorn.run(app, **uvicorn_options(settings))


def serve_workers(settings: ServerSettings) -> None:
    """`settings.workers` processes on one port: uvicorn's process manager (it binds the socket, starts the
    workers, restarts one that dies, stops them on SIGINT/SIGTERM), each worker a whole server (`worker_app`).
    What they share: the cache file (a simulation is leased in it, so two workers do not simulate one call
    twice), the request log (whole lines, O_APPEND) and the metrics (prometheus-client's multiprocess mode:
    a folder of this run where each worker writes its values, and /metrics of any worker adds them up).

    This process first builds one app as a check: a user's mistake fails here in one line, before anything
    listens (a worker failing at start would be restarted by uvicorn for ever), and the StableToolBench
    cache folder is imported here, once, not by every worker at the same time."""
    check = create_app(settings)
    check.state.cache.close()
    check.state.request_log.close()
    del check
    gc.unfreeze()  # create_app froze the tool docs; this process keeps none of them
    gc.collect()
    worker_settings = settings.model_copy(update={"cache_folder": None})  # imported above
    with tempfile.TemporaryDirectory(prefix="mirrorapi-metrics-") as metrics:
        # Read by prometheus-client when a worker imports it: set before uvicorn starts them (they inherit it).
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        os.environ[WORKER_SETTINGS_ENV] = worker_settings.model_dump_json()
        options = uvicorn_options(settings)
        options["http"] = "mirrorapi.serving.transport:ReceiveDeadline"  # workers import it by name
        logger.info("starting %d worker processes (metrics summed over them in %s)", settings.workers, metrics)
        try:
            uvicorn.run(f"{__name__}:worker_app", factory=True, workers=settings.workers, **options)
        finally:  # this process may go on (a caller of serve): no pointer to a folder about to be removed
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            os.environ.pop(WORKER_SETTINGS_ENV, None)


def worker_app() -> VirtualEndpoint:
    """The app of one worker process of `serve_workers` (uvicorn calls it in the worker)."""
    if WORKER_SETTINGS_ENV not in os.environ:
        raise RuntimeError("worker_app is the app of a worker started by `mirrorapi serve --workers N`; run that")
    settings = ServerSettings.model_validate_json(os.environ[WORKER_SETTINGS_ENV])
    configure_logging(settings)
    ReceiveDeadline.request_timeout = settings.request_timeout  # this process serves this one server only
    return create_app(settings)
