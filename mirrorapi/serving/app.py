"""The virtual API server's app: `create_app(settings)` and `serve(settings)`; wiring only.

Where a request goes: `VirtualEndpoint` (below) is the outermost ASGI app. It checks the API key and answers
`POST /virtual` itself (StableToolBench's contract, `mirrorapi.serving.protocol`; the work is
`mirrorapi.serving.handler.VirtualApi`, reached through `VirtualServer.answer`, which also counts and logs the
call); it hands `/mcp` to the MCP front door (`mirrorapi.serving.mcp_server`), OpenEnv's `/reset`, `/step`,
`/state` and WebSockets to its episodes (`mirrorapi.serving.openenv`), and every other path to the FastAPI app of
`mirrorapi.serving.routes` (`/health`, `/live`, `/metrics`). /virtual stays the first thing it checks, so the other
doors cost it nothing. Every door gets the one `VirtualServer` (`mirrorapi.serving.server`) built here.

`create_app` loads the tools and opens the store (importing `cache_folder` once) before anything
listens, so a bad tools file or cache fails at start-up in one line; the lifespan reports whether the engine
answers. The server starts, and serves cache hits, even when the engine is not reachable yet (vLLM can take
minutes to load a model).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from mirrorapi.serving.asgi import (
    UNAUTHORIZED,
    BodyTooLarge,
    ClientGone,
    authorized,
    error_body,
    foreign_request,
    header_text,
    read_body,
    send_json,
)
from mirrorapi.serving.config import ConfigError, ServerSettings, is_loopback, model_record_settings
from mirrorapi.serving.mcp_server import MCP_PATH, McpFrontDoor
from mirrorapi.serving.openenv import HTTP_PATHS, MCP_WS_PATH, WS_PATH, Episodes
from mirrorapi.serving.protocol import OUTCOME_HEADER, PROVENANCE_HEADER, RETRY_HEADER, SESSION_HEADER
from mirrorapi.serving.routes import router
from mirrorapi.serving.server import VirtualServer
from mirrorapi.serving.transport import Connections, RequestDeadlineMiddleware, check_uvicorn, uvicorn_options

logger = logging.getLogger(__name__)

# The cyclic garbage collector of a server process: a young collection every GC_YOUNG_OBJECTS allocations (Python's
# default, 700, promotes whatever lives a fraction of a second to the old generation, whose full collections then
# scan every object of every open connection: at 16,384 OpenEnv episodes, where a step waits seconds for its turn,
# they took half the server's CPU, by py-spy, and a step's CPU grew 2.7 times from 1,024 episodes).
GC_THRESHOLDS = (50_000, 20, 10)
MASTER_WATCH_SECONDS = 0.5  # how often a worker of `serve_workers` checks that the process that started it lives
WORKER_STOP_SECONDS = 15.0  # what a worker whose master is gone is given to stop gracefully before it exits
OPEN_PATHS = ("/health", "/live")  # answered without the server's API key (probes of orchestrators)
# The settings of the worker processes (`serve_workers`): uvicorn starts them by importing a factory, which reads
# them from a file only this user can read (WORKER_SETTINGS_FILE), named by this variable.
WORKER_SETTINGS_ENV = "_MIRRORAPI_WORKER_SETTINGS"  # the path of the settings file of `serve_workers`' workers
WORKER_SETTINGS_FILE = "worker-settings.json"
WORKER_FAILED_FILE = "worker-failed"  # in the run's metrics folder: why a worker could not start (`worker_app`)
MASTER_ENV = "_MIRRORAPI_MASTER_PID"  # the process that starts the workers (it may die before one has started)


class VirtualEndpoint:
    """`/virtual` as the outermost ASGI app, in front of the FastAPI app that serves the routes (the API key of
    every path and `/virtual`'s 405 and 413 are answered here too, in the `{"error", "response"}` shape). Why not
    a FastAPI route: measured side by side (bench/server.py runs bench/virtual_route.py, the same server with
    /virtual as a route with typed dependencies, beside this one), a cache hit through the route costs 4.9 times the
    server CPU (0.378 ms against 0.076 ms, 64 clients, 2 cores, 2026-11-26), where issue 19 allowed 10% more. The
    server's `answer` turns every failure into a response, so nothing is lost by bypassing Starlette's error
    middleware.
    `connections`: the receive deadlines of this app's connections (`mirrorapi.serving.transport`)."""

    def __init__(self, app: FastAPI, server: VirtualServer, mcp: McpFrontDoor, episodes: Episodes):
        self.app, self.server, self.mcp, self.episodes = app, server, mcp, episodes
        settings = server.settings
        self.api_key = settings.server_api_key.encode() if settings.server_api_key else None
        self.loopback_only = is_loopback(settings.host)
        allowed = {name.lower().rstrip(".") for name in settings.allowed_hosts}
        self.known_host = lambda name: is_loopback(name) or name.lower().rstrip(".") in allowed
        self.max_body = settings.max_body_bytes
        self.connections = Connections(settings.request_timeout, server.refused)
        self.others = RequestDeadlineMiddleware(self.dispatch, self.connections)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            deadline = self.connections.of(scope)
            deadline.started()
            try:
                return await self.http(scope, receive, send)
            finally:
                deadline.answered()
        if scope["type"] == "websocket" and (foreign := foreign_request(scope, self.known_host, self.loopback_only)):
            self.server.refused(foreign[0], "foreign_origin", scope["path"][:80])
            return await send({"type": "websocket.close", "code": 1008})  # HTTP 403 to the handshake
        if scope["type"] == "websocket" and scope["path"] in (WS_PATH, MCP_WS_PATH):
            if self.api_key is not None and not authorized(scope, self.api_key):
                self.server.refused(401, "unauthorized", scope["path"])
                return await send({"type": "websocket.close", "code": 1008})  # HTTP 403 to the handshake
            return await self.episodes.websocket(scope, receive, send)
        return await self.app(scope, receive, send)

    async def http(self, scope, receive, send) -> None:
        path = scope["path"]
        if foreign := foreign_request(scope, self.known_host, self.loopback_only):
            self.connections.of(scope).received()
            await send_json(send, foreign[0], error_body(foreign[1]))
            return self.server.refused(foreign[0], "foreign_origin", path[:80])
        if self.api_key is not None and path not in OPEN_PATHS and not authorized(scope, self.api_key):
            self.connections.of(scope).received()
            await send_json(send, 401, error_body(UNAUTHORIZED), [(b"www-authenticate", b"Bearer")])
            return self.server.refused(401, "unauthorized", path[:80])
        if path != "/virtual" and path != "/virtual/":  # with the slash: StableToolBench's FastAPI server redirects
            return await self.others(scope, receive, send)  # it there (307), so a client's URL may end so
        deadline = self.connections.of(scope)
        if scope["method"] != "POST":
            deadline.received()
            await send_json(send, 405, error_body("Method Not Allowed: /virtual takes POST"), [(b"allow", b"POST")])
            return self.server.refused(405, "method_not_allowed", scope["method"][:20])
        try:
            body = await read_body(scope, receive, self.max_body)
        except BodyTooLarge as exc:
            deadline.received()
            await send_json(send, 413, error_body(str(exc)), [(b"connection", b"close")])
            return self.server.refused(413, "body_too_large", f"{exc.size:,} bytes or more")
        except ClientGone:
            return
        deadline.received()
        session_id = None
        for name, value in scope["headers"]:
            if name == SESSION_HEADER:
                session_id = header_text(value)
                break
        try:
            answer = await self.server.answer(body, session_id, lambda: deadline.lost)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when its graceful stop is over (uvicorn_options): an answer
            # in the API's shape, counted and logged, instead of uvicorn's plain-text 500; a simulation under way
            # goes on and is stored before the cache closes (Responder.drain), for the client's retry to find.
            with contextlib.suppress(Exception):
                await send_json(
                    send, 503, error_body(SHUTTING_DOWN), [(b"connection", b"close"), (b"retry-after", b"5")]
                )
            self.server.refused(503, "shutting_down")
            raise
        headers = answer_headers(answer.outcome, answer.provenance, answer.transient)
        await send_json(send, answer.status, answer.body, headers)

    async def dispatch(self, scope, receive, send) -> None:
        path = scope["path"]
        if path.rstrip("/") == MCP_PATH:
            return await self.mcp.asgi(scope, receive, send)
        if path in HTTP_PATHS:
            deadline = self.connections.of(scope)
            return await self.episodes.http(scope, receive, send, lambda: deadline.lost)
        return await self.app(scope, receive, send)


SHUTTING_DOWN = "Failed to generate fake response (the server is shutting down; retry in a moment)"

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")  # what a header value may hold as is


@functools.lru_cache(maxsize=1024)  # a server gives a handful of outcomes and provenances, over and over
def answer_headers(outcome: str, provenance: str | None, transient: bool = False) -> list[tuple[bytes, bytes]]:
    """The headers that say how a /virtual call was answered (`mirrorapi.serving.protocol`)."""
    headers = [(OUTCOME_HEADER, outcome.encode("ascii"))]
    if transient:
        headers.append((RETRY_HEADER, b"1"))
    if provenance is not None:
        headers.append((PROVENANCE_HEADER, urllib.parse.quote(provenance, safe=PRINTABLE).encode("ascii")))
    return headers


def without_password(url: str) -> str:
    """A database URL as logs show it: its password (in the user part or a `password` parameter) as `***`; one
    that cannot be read as a URL (`postgresql://u:pw@[::1/db`), as its scheme and `***`."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (what raises on a bad port)
    except ValueError:  # an unclosed IPv6 bracket, a port that is no number: crashed the start with a traceback
        return url.split(":", 1)[0] + "://***" if "://" in url else "***"
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and all(k != "password" for k, _ in query):
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1) if parts.password is not None else parts.netloc
    query_text = urllib.parse.urlencode([(k, "***" if k == "password" else v) for k, v in query], safe="*")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query_text))


def create_app(settings: ServerSettings) -> VirtualEndpoint:
    """The ASGI app of one server (`.server`: its `VirtualServer`; `.app`: the FastAPI app of the routes). Raises
    RegistryError / CacheError / ConfigError (one line each) when the tools, the store or a setting cannot be
    used."""
    server = VirtualServer.build(settings)
    mcp, episodes = McpFrontDoor(server), Episodes(server)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with server.running(), mcp.run():
            yield

    # FastAPI's OpenTelemetry hooks are off: /metrics is the server's telemetry, and the check costs
    # environment lookups on every request.
    app = FastAPI(
        title="mirrorapi virtual API server",
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.server = server  # the routes' `ServerDep`
    app.include_router(router)
    return VirtualEndpoint(app, server, mcp, episodes)


def raise_open_file_limit() -> tuple[int, int]:
    """(before, after): the soft limit of open files raised to the hard limit. Every connection is a file
    descriptor (16,384 OpenEnv episodes are 16,384 sockets), and the usual soft limit is 1,024 however high the
    hard one; a process may raise its own soft limit up to the hard one, so the server does, at start."""
    try:
        import resource
    except ImportError:  # not a Unix: nothing to raise
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            logger.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
            return soft, soft
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def configure_logging(settings: ServerSettings) -> None:
    """Logging of the server process (start-up, engine and cache events; request lines are `RequestLogWriter`'s)."""
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def serve(settings: ServerSettings) -> None:
    """Build the app and run uvicorn until interrupted (raises RegistryError / CacheError at start-up); with
    `workers` > 1, uvicorn's worker processes (`serve_workers`)."""
    configure_logging(settings)
    shown = {k: v for k, v in settings.non_default().items() if k not in ("api_key", "server_api_key")}
    if shown.get("cache_url"):
        shown["cache_url"] = without_password(shown["cache_url"])
    logger.info("settings (not default): %s", shown)
    if settings.model_settings == "auto" and (named := model_record_settings(settings.model)):
        logger.info(
            "model %s: its record (mirrorapi_training.json) names %s; a value the config, the environment or a "
            "flag gives wins (model_settings: off ignores the record)",
            settings.model,
            named,
        )
    if (warning := check_uvicorn()) is not None:
        logger.warning("%s", warning)
    gc.set_threshold(*GC_THRESHOLDS)
    before, after = raise_open_file_limit()  # workers inherit it
    if after >= 0:
        logger.info("open files: up to %d (soft limit raised from %d)", after, before)
        if after < settings.max_episodes + 256:
            logger.warning(
                "open files limit %d is below max_episodes %d: raise the hard limit (ulimit -Hn) to hold "
                "that many OpenEnv episodes",
                after,
                settings.max_episodes,
            )
    check_address_free(settings.host, settings.port)
    if settings.workers > 1:
        return serve_workers(settings)
    app = create_app(settings)
    uvicorn.run(app, **uvicorn_options(settings))


def check_address_free(host: str, port: int) -> None:
    """ConfigError when the server could not listen on host:port: the port taken (another server, a second start),
    or a host that is no name or address of this machine. Checked before the app is built, which may import a large
    cache folder first; uvicorn found it only after that, and said so in a line among the INFO lines of its start
    and shutdown, exit status 3. Bound as uvicorn binds (SO_REUSEADDR) and let go; any other refusal (a port below
    1024 without the right) is left to uvicorn's own message."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # uvicorn's choice of family for a host
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][4]
    except socket.gaierror as exc:
        raise ConfigError(f"host: cannot listen on {host!r}: {exc.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port: {host}:{port} is in use (another server, or this one started twice): stop it or choose "
                    "another --port"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"host: {host} is not an address of this machine") from None


def serve_workers(settings: ServerSettings) -> None:
    """`settings.workers` processes on one port: uvicorn's process manager (it binds the socket, starts the
    workers, restarts one that dies, stops them on SIGINT/SIGTERM), each worker a whole server (`worker_app`).
    What they share: the cache file (a simulation is leased in it, so two workers do not simulate one call
    twice), the request log (whole lines, O_APPEND) and the metrics (prometheus-client's multiprocess mode:
    a folder of this run where each worker writes its values, and /metrics of any worker adds them up).

    This process first builds one app as a check: a user's mistake fails here in one line, before anything
    listens (a worker failing at start would be restarted by uvicorn for ever), and the StableToolBench
    cache folder is imported here, once, not by every worker at the same time."""
    create_app(settings).server.close()
    gc.unfreeze()  # create_app froze the tool docs; this process keeps none of them
    gc.collect()
    worker_settings = settings.model_copy(update={"cache_folder": None})  # imported above
    with tempfile.TemporaryDirectory(prefix="mirrorapi-metrics-") as metrics:
        # Read by prometheus-client when a worker imports it: set before uvicorn starts them (they inherit it).
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        # The settings (the engine's and the server's keys among them) go to the workers in a file only this user
        # may read, in the run's private folder; in the environment, every process a worker started inherited
        # them, and /proc/<pid>/environ showed them (audit of 2026-12-01). Kept for a worker uvicorn restarts.
        shared = Path(metrics) / WORKER_SETTINGS_FILE
        with open(os.open(shared, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as fh:
            fh.write(worker_settings.model_dump_json())
        os.environ[WORKER_SETTINGS_ENV] = str(shared)
        os.environ[MASTER_ENV] = str(os.getpid())
        options = uvicorn_options(settings)
        logger.info("starting %d worker processes (metrics summed over them in %s)", settings.workers, metrics)
        try:
            uvicorn.run(f"{__name__}:worker_app", factory=True, workers=settings.workers, **options)
        finally:  # this process may go on (a caller of serve): no pointer to a folder about to be removed
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            os.environ.pop(WORKER_SETTINGS_ENV, None)
            os.environ.pop(MASTER_ENV, None)
        failed = Path(metrics) / WORKER_FAILED_FILE
        if failed.exists():
            raise ConfigError(f"a worker process could not start, so the server stopped: {failed.read_text()}")


def worker_app() -> VirtualEndpoint:
    """The app of one worker process of `serve_workers` (uvicorn calls it in the worker)."""
    if WORKER_SETTINGS_ENV not in os.environ:
        raise RuntimeError("worker_app is the app of a worker started by `mirrorapi serve --workers N`; run that")
    settings = ServerSettings.model_validate_json(Path(os.environ[WORKER_SETTINGS_ENV]).read_text(encoding="utf-8"))
    configure_logging(settings)
    gc.set_threshold(*GC_THRESHOLDS)
    master = int(os.environ.get(MASTER_ENV) or os.getppid())
    die_with_master(master)
    try:
        return create_app(settings)
    except Exception as exc:
        # What the master's check did not meet (the shared store gone since): uvicorn would start this worker again
        # and again, without end, the port bound and nothing answering. The server stops instead, saying why.
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        logger.error("worker %d could not start (%s): stopping the server", os.getpid(), reason)
        if folder := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            (Path(folder) / WORKER_FAILED_FILE).write_text(reason, encoding="utf-8")
        os.kill(master, signal.SIGTERM)
        raise


def die_with_master(master: int) -> None:
    """Stop this worker when `master`, the process that started it, is gone (killed with SIGKILL, it cannot stop
    its workers): they would go on serving on its port, and a new server could not bind it. A thread looks every
    MASTER_WATCH_SECONDS (portable, unlike Linux's PR_SET_PDEATHSIG, which also fires when the thread that started
    the process ends); the worker then gets SIGTERM (uvicorn's graceful stop), and exits if it is still there
    WORKER_STOP_SECONDS later."""

    def watch() -> None:
        while os.getppid() == master:
            time.sleep(MASTER_WATCH_SECONDS)
        logger.warning("the server's master process %d is gone: this worker (%d) stops", master, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(WORKER_STOP_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-master", daemon=True).start()
