"""The virtual API server: `create_app(settings)` and `serve(settings)`; wiring only.

Routes: `POST /virtual` (StableToolBench's contract, see `mirrorapi.serving.protocol`; the work is done by
`mirrorapi.serving.handler.VirtualApi`), `GET /health` (engine reachability, cache size), `GET /metrics`
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
import gc
import logging
import sqlite3

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest

from mirrorapi.engine_client import EngineClient
from mirrorapi.serving.cache import CacheError, ResponseCache, import_stabletoolbench_cache
from mirrorapi.serving.config import ConfigError, ServerSettings
from mirrorapi.serving.handler import VirtualApi
from mirrorapi.serving.mcp_server import MCP_PATH, McpFrontDoor
from mirrorapi.serving.observability import RequestLogWriter, ServerMetrics
from mirrorapi.serving.protocol import SESSION_HEADER
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import RegistryError, ToolRegistry
from mirrorapi.toolsets import ToolsetError, select_toolset

logger = logging.getLogger(__name__)

# What a user can get wrong at start-up; each is one line that says what to change.
STARTUP_ERRORS = (ConfigError, RegistryError, CacheError)
CACHE_MAINTENANCE_SECONDS = 5.0
JSON_HEADERS = [(b"content-type", b"application/json")]


class VirtualEndpoint:
    """`/virtual` as the outermost ASGI app, in front of the FastAPI app that serves everything else.
    Why not a FastAPI route or middleware: its request/response machinery (error and telemetry
    middleware, router, route wrapper) costs about 0.1 ms of CPU per request, half the budget of a
    cache hit (bench/server.py). `answer` turns every failure into a response, so nothing is lost
    by bypassing Starlette's error middleware."""

    def __init__(self, app: FastAPI):
        self.app, self.state = app, app.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/virtual":
            if scope["type"] == "http" and scope["path"].rstrip("/") == MCP_PATH:
                return await self.state.mcp.asgi(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            body = b'{"error":"Method Not Allowed: /virtual takes POST","response":""}'
            await send({"type": "http.response.start", "status": 405, "headers": JSON_HEADERS + [(b"allow", b"POST")]})
            return await send({"type": "http.response.body", "body": body})
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        session_id = None
        for name, value in scope["headers"]:
            if name == SESSION_HEADER:
                session_id = value.decode("latin-1")
                break
        state = self.state
        answer = await state.virtual.answer(b"".join(chunks), session_id)
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": JSON_HEADERS + [(b"content-length", b"%d" % len(answer.body))]})
        await send({"type": "http.response.body", "body": answer.body})
        state.metrics.record(answer)
        state.request_log.record(answer)


async def _maintain_cache(cache: ResponseCache) -> None:
    """Every few seconds: hand the counted hits to the cache's writer thread (no waiting here), then
    checkpoint the WAL in a worker thread (it syncs the disk)."""
    while True:
        await asyncio.sleep(CACHE_MAINTENANCE_SECONDS)
        cache.flush_hits()
        try:
            await asyncio.to_thread(cache.checkpoint)
        except sqlite3.Error as exc:  # e.g. another process holds the database: try again later
            logger.warning("cache checkpoint postponed: %s", exc)


async def _report_engine(engine: EngineClient) -> None:
    for replica in await engine.health():
        if replica.reachable:
            logger.info("engine %s answers (%s)", replica.base_url, replica.detail)
        else:
            logger.warning("engine %s is not reachable yet (%s): cache hits are served, misses get an error "
                           "observation until it answers", replica.base_url, replica.detail)


def create_app(settings: ServerSettings) -> VirtualEndpoint:
    """The ASGI app (`.app`: the FastAPI app behind /virtual; `.state`: its state). Raises
    RegistryError / CacheError (one line each) when the tools or the cache cannot be used."""
    registry = ToolRegistry.load(settings.tools_folder)
    stats = registry.stats()
    logger.info("tools: %d categories, %d tools, %d APIs loaded in %.2f s (%d unreadable files skipped)",
                stats["categories"], stats["tools"], stats["apis"], stats["load_seconds"], stats["unreadable"])
    cache = ResponseCache(settings.cache_path, autocheckpoint=False)
    if settings.cache_folder is not None:
        import_stabletoolbench_cache(cache, settings.cache_folder, registry=registry)
    cache.start_writer()  # from here on, writes leave the event loop
    try:  # the configured MCP toolset must name known APIs: checked before anything listens
        toolset = select_toolset(registry, settings.mcp_toolset)
    except ToolsetError as exc:
        raise ConfigError(f"mcp_toolset: {exc}") from None
    logger.info("MCP at %s: %d tools in the default toolset", MCP_PATH, len(toolset.functions))
    logger.info("cache %s: %d entries", settings.cache_path, cache.count())
    # The tool docs are millions of long-lived objects: keep them out of the garbage collector's
    # full passes, which otherwise stall every request for a hundred milliseconds now and then.
    gc.freeze()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = EngineClient(settings.api_base, settings.model, settings.api_key, timeout=settings.engine_timeout,
                              retries=settings.engine_retries)
        app.state.simulator = simulator = Simulator(engine, cache, settings)
        logger.info("simulator identity (simulated answers are looked up and stored under it): %s", simulator.identity)
        app.state.virtual = VirtualApi(settings, registry, cache, simulator)
        background = [asyncio.create_task(_maintain_cache(cache))]
        if settings.mode == "simulate":  # probed in the background: a hanging engine must not delay start-up
            background.append(asyncio.create_task(_report_engine(engine)))
        try:
            async with app.state.mcp.run():
                yield
        finally:
            for task in background:
                task.cancel()
            # Simulations outlive requests whose client went away; their answers are stored before the cache closes.
            await simulator.drain(timeout=settings.engine_timeout + 5)
            app.state.request_log.close()
            cache.close()  # after its writer thread has committed everything handed to it
            await engine.aclose()

    # FastAPI's OpenTelemetry hooks are off: /metrics is the server's telemetry, and the check costs
    # environment lookups on every request.
    app = FastAPI(title="mirrorapi virtual API server", lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.settings, app.state.registry, app.state.cache = settings, registry, cache
    app.state.metrics = ServerMetrics(app.state)
    app.state.request_log = RequestLogWriter(settings)
    app.state.mcp = McpFrontDoor(app.state)

    @app.get("/health")
    async def health() -> JSONResponse:
        engines = [] if settings.mode == "replay" else await app.state.simulator.engine.health(timeout=2.0)
        reachable = all(e.reachable for e in engines)
        return JSONResponse({
            "status": "ok" if reachable else "degraded", "mode": settings.mode, "model": settings.model,
            "prompt_format": settings.prompt_format,
            "engine": [{"base_url": e.base_url, "reachable": e.reachable, "detail": e.detail} for e in engines],
            "cache": {"path": str(settings.cache_path), "entries": cache.count()},
            "tools": {k: stats[k] for k in ("categories", "tools", "apis")},
            "sessions": {"open": len(app.state.virtual.sessions), "history": settings.session_history,
                         "cache_entries": cache.session_count()},
        })

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(app.state.metrics.registry), media_type="text/plain; version=0.0.4")

    return VirtualEndpoint(app)


def configure_logging(settings: ServerSettings) -> None:
    """Logging of the server process (start-up, engine and cache events; request lines are `RequestLogWriter`'s)."""
    logging.basicConfig(level=getattr(logging, settings.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(settings: ServerSettings) -> None:
    """Build the app and run uvicorn until interrupted (raises RegistryError / CacheError at start-up)."""
    import uvicorn

    configure_logging(settings)
    logger.info("settings (not default): %s", {k: v for k, v in settings.non_default().items() if k != "api_key"})
    app = create_app(settings)
    # log_config=None: uvicorn's loggers go through ours; its access log is replaced by RequestLogWriter's lines.
    # No proxy-header rewriting: the server binds 127.0.0.1 by default and reports no client addresses.
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False, proxy_headers=False,
                log_level=settings.log_level, timeout_graceful_shutdown=5)
