"""One virtual API server's state, typed and built once (`VirtualServer`): the settings, the tools, the store, the
engine client, the /virtual request path, the metrics and the request log. `create_app` builds it and hands it to
every front door (the /virtual endpoint, the routes, /mcp, OpenEnv's episodes); each answers a call with
`VirtualServer.answer`, which also records it (metrics and the request log line), so that is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from mirrorapi.engine_client import EngineClient
from mirrorapi.serving.answer import Answer
from mirrorapi.serving.arguments import LARGE_BODY_BYTES
from mirrorapi.serving.cache import (
    CacheError,
    Store,
    import_stabletoolbench_cache,
    is_url,
    lease_holder,
    open_cache,
)
from mirrorapi.serving.config import ConfigError, ServerSettings
from mirrorapi.serving.handler import LargeBodies, VirtualApi
from mirrorapi.serving.observability import RequestLogWriter, ServerMetrics
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import ApiDoc, ToolRegistry
from mirrorapi.toolsets import ToolsetCache, ToolsetError, select_toolset

logger = logging.getLogger(__name__)

CACHE_MAINTENANCE_SECONDS = 5.0


class VirtualServer:
    """Everything a request of one server needs. Built before anything listens (a bad tools folder or cache fails
    here, in one line); `running()` is the lifespan: maintenance and the engine probe in the background, and on
    the way out the simulations in flight stored before the store closes."""

    def __init__(self, settings: ServerSettings, registry: ToolRegistry, cache: Store):
        self.settings, self.registry, self.cache = settings, registry, cache
        stats = registry.stats()
        self.tool_counts = {k: stats[k] for k in ("categories", "tools", "apis")}  # for /health
        self.metrics = ServerMetrics()
        self.request_log = RequestLogWriter(settings)
        self.toolsets = ToolsetCache(registry)  # the toolsets of /mcp URLs and OpenEnv resets already seen
        self.engine = EngineClient(
            settings.api_base,
            settings.model,
            settings.api_key,
            timeout=settings.engine_timeout,
            attempt_timeout=settings.attempt_timeout(),
            retries=settings.engine_retries,
            cooldown=settings.engine_cooldown,
            # The limits are the server's, per replica: each worker process takes its share (they hold no count
            # in common), rounded up, so a replica gets at most about the limit from all of them together.
            max_in_flight=-(-settings.engine_max_in_flight // settings.workers),
            max_waiting=-(-settings.engine_max_waiting // settings.workers),
            # Streamed: llama.cpp's server and `transformers serve` stop generating when the client of a streamed
            # request goes away, and finish every other one, so a call given up on (engine_timeout) would keep the
            # one-at-a-time CPU engine busy for nobody and time the next calls out too.
            stream=True,
        )
        # Servers that share the store simulate a call once between them (a lease per call in the store).
        shared = settings.workers > 1 or is_url(settings.cache_url or "")
        self.virtual = VirtualApi(
            settings,
            registry,
            cache,
            Simulator(self.engine, settings),
            self.metrics,
            lease_holder() if shared else None,
        )

    @classmethod
    def build(cls, settings: ServerSettings) -> VirtualServer:
        """Load the tools and open the store (importing `cache_folder` once) before anything listens; raises
        RegistryError / CacheError / ConfigError (one line each) when they cannot be used."""
        for warning in settings.startup_warnings():
            logger.warning("%s", warning)
        registry = ToolRegistry.load(settings.tools_folder)
        stats = registry.stats()
        logger.info(
            "tools: %d categories, %d tools, %d APIs loaded in %.2f s (%d unreadable files skipped; "
            "compiled index: %s)",
            stats["categories"],
            stats["tools"],
            stats["apis"],
            stats["load_seconds"],
            stats["unreadable"],
            ", ".join(stats["indexes"]) or "none",
        )
        if not stats["apis"]:  # every call would be an unknown API while /health said ok
            raise ConfigError(
                f"tools_folder: no API doc in {', '.join(map(str, settings.tools_folder))} (a tools folder holds "
                "<category>/<tool>.json files, e.g. ToolEnv2404's tools/; or give StableToolBench query files or "
                "OpenAI function files)"
            )
        cache = open_server_cache(settings)
        try:
            if settings.cache_folder is not None:
                import_stabletoolbench_cache(cache, settings.cache_folder, registry=registry)
            try:  # the configured MCP toolset must name known APIs: checked before anything listens
                toolset = select_toolset(registry, settings.mcp_toolset)
            except ToolsetError as exc:
                raise ConfigError(f"mcp_toolset: {exc}") from None
            logger.info("MCP: %d tools in the default toolset", len(toolset.functions))
            logger.info("cache %s: %d entries", cache.location, cache.count())
        except BaseException:
            cache.close()
            raise
        # The tool docs are millions of long-lived objects: keep them out of the garbage collector's
        # full passes, which otherwise stall every request for a hundred milliseconds now and then.
        gc.freeze()
        return cls(settings, registry, cache)

    async def answer(
        self, body: bytes, session_id: str | None = None, client_gone: Callable[[], bool] | None = None
    ) -> Answer:
        """The answer to a /virtual body (whichever door it came by), counted in the metrics and logged;
        `client_gone` (the HTTP door's) says whether the client has closed its connection."""
        return self._recorded(await self.virtual.answer(body, session_id, client_gone))

    async def answer_call(
        self, doc: ApiDoc, arguments: Any, session_id: str | None, client_gone: Callable[[], bool] | None = None
    ) -> Answer:
        """The answer to a call of a known API (an OpenEnv step), as /virtual gives it; counted and logged."""
        return self._recorded(await self.virtual.answer_call(doc, arguments, session_id, client_gone))

    def refused(self, status: int, outcome: str, detail: str = "") -> None:
        """A request refused before any handler (401, 405, 408, 413), counted and logged like an answer."""
        self._recorded(Answer(status, b"", outcome, detail=detail))

    def _recorded(self, answer: Answer) -> Answer:
        """The one place a call is counted in the metrics and written to the request log."""
        self.metrics.record(answer)
        self.request_log.record(answer)
        return answer

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While the server serves: the store's maintenance and (simulate mode) a report of the engine."""
        settings = self.settings
        if settings.mode == "simulate":
            logger.info("%s", settings.attempt_timeout_reason())
        logger.info(
            "simulator identity (simulated answers are looked up and stored under it): %s",
            self.virtual.responder.identities[False],
        )
        if settings.max_body_bytes >= LARGE_BODY_BYTES:
            LargeBodies.start()  # its worker process starts in the background, shared by this process's apps
        background = [asyncio.create_task(self._maintain_cache())]
        try:  # SIGHUP: the request log opened again (log rotation); a server in a thread (tests) cannot have one
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.request_log.reopen)
            hangup = True
        except (ValueError, RuntimeError, NotImplementedError, AttributeError):
            hangup = False
        if settings.mode == "simulate":  # probed in the background: a hanging engine must not delay start-up
            background.append(asyncio.create_task(self._report_engine()))
        try:
            yield
        finally:
            if hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            for task in background:
                task.cancel()
            # Simulations outlive requests whose client went away; their answers are stored before the store closes.
            await self.virtual.responder.drain(timeout=settings.engine_timeout + 5)
            self.request_log.close()
            await self.cache.aclose()  # after everything handed to it is committed
            await self.engine.aclose()

    def close(self) -> None:
        """Close what was opened without having served (the check app of `serve_workers`)."""
        self.cache.close()
        self.request_log.close()

    async def _maintain_cache(self) -> None:
        """Every few seconds: write the counted hits, forget idle sessions and expired leases, let go the leases a
        failed store left, checkpoint."""
        while True:
            await asyncio.sleep(CACHE_MAINTENANCE_SECONDS)
            try:
                await self.virtual.responder.release_leases_left()
                await self.cache.maintain(self.settings.session_ttl)
            except CacheError as exc:  # e.g. the database is away for a moment: next time
                logger.warning("cache maintenance postponed: %s", exc)

    async def _report_engine(self) -> None:
        """One line per replica at start-up: whether it serves the configured model."""
        for replica in await self.engine.health():
            if replica.ok:
                logger.info("engine %s serves model %r (%s)", replica.base_url, self.engine.model, replica.detail)
            elif replica.reachable:
                logger.warning(
                    "engine %s %s: fix `model` (or `api_base`); misses get an error observation until it does",
                    replica.base_url,
                    replica.detail,
                )
            else:
                logger.warning(
                    "engine %s is not reachable yet (%s): cache hits are served, misses get an error "
                    "observation until it answers",
                    replica.base_url,
                    replica.detail,
                )


def open_server_cache(settings: ServerSettings) -> Store:
    """The store a server answers from: PostgreSQL at `cache_url`, else the SQLite file `cache_path` (checkpointed
    by the server's maintenance, off the request path)."""
    if settings.cache_url:
        return open_cache(settings.cache_url)
    return open_cache(settings.cache_path, autocheckpoint=False)
