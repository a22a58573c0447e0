"""The one module of the server that reaches below uvicorn's public API (issue 36 §1): a deadline for receiving
each request and the gathered writes, around the HTTP protocol uvicorn itself picks, and the server's uvicorn
options (`uvicorn_options`). Nothing else imports uvicorn but `app.py`, for `uvicorn.run`.

What it relies on, beyond `uvicorn.run(app, http=<a protocol class>)`, checked by tests/serving/test_transport.py
(which fails, naming the piece, when a uvicorn release moves one) and pinned to the uvicorn releases it was tested
with (`TESTED_UVICORN`, and pyproject.toml's range): uvicorn's table of HTTP protocols
(`uvicorn.config.HTTP_PROTOCOLS["auto"]`), the keyword arguments it builds a protocol with (`config`,
`server_state`, `app_state`, `_loop`), its `Config.loaded_app` (where the protocol finds the app's `Connections`),
and the transport methods its protocols call (what `GatheredWrites` stands in for). Measured against the public
API alone (bench/uvicorn_paths.py, figures in docs/serving.md): see there why this is kept.

Why a deadline of our own: uvicorn has no timeout for receiving a request. `timeout_keep_alive` covers
only the idle time between requests and is reset by every byte received, so a client that trickles
its headers or body a byte at a time holds a connection for ever (uvicorn issue #157); ASGI code
cannot help alone, as it runs only once the headers are complete. `ReceiveDeadline` is an `asyncio.Protocol`
that wraps, by composition, the HTTP protocol uvicorn itself picks (`http="auto"`). It notes the time of the first
byte of each request; the ASGI side notes when the whole request is in (`RequestDeadlineMiddleware`
for every route, `Connections.of(scope).received()` on /virtual). If a request is still coming in
`request_timeout` seconds after its first byte, the client gets HTTP 408 (nothing has been answered
yet) and the connection is closed. One timer per connection checks that: it is armed by a request's
first byte when none is, and when it fires it either answers 408, or is armed again for the request
now coming in, or (an idle connection) stops. A timer per request (armed, then cancelled, for requests
that arrive whole within microseconds) took 1-2% of a cache hit's server CPU in py-spy's profile. A
connection on a Unix socket has no peer address to find its deadline by, and no deadline. Each app keeps its own
connections and deadline (`Connections`, made by the app from its settings): no state is kept in a class, so
servers in one process (the tests) and worker processes need nothing set from outside.

Why the close lingers: closing a socket whose client is still sending (a trickler is, by definition)
makes the kernel answer with a reset, and a reset can make the client's kernel discard the 408 it has
not read yet. So the 408 is followed by a half-close (FIN), what the client still sends is read and
dropped, and the socket is closed once the client closes or after `LINGER_SECONDS` (nginx's
"lingering close").

Why writes are gathered (`GatheredWrites`): uvicorn writes a response's head and its body with one
`transport.write` each, and the event loop sends each at once, one `send()` system call apiece. On
loopback, a send also delivers the segment and wakes the client inside the call: measured with `perf`
on the server under bench/server.py's 64-client hits, the two sends were 22% of the server's CPU. So
uvicorn's protocol writes to a stand-in for the transport that keeps what one turn of the event loop
writes on a connection and hands it to the real transport once, right after that turn: one send per
response, usually, and none of the answer's bytes later than the turn that produced them. Sending each
/virtual answer at once instead, as soon as it was whole, cost more: 118-133 against 83-103 us of server
CPU per hit in side-by-side runs (bench/server.py's 64-client hits; likely because answers that leave
together bring the clients' next requests back together, so each wake-up of the loop serves more).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any, cast

import uvicorn.config
import uvicorn.importer

from mirrorapi.serving.asgi import error_body, has_body
from mirrorapi.serving.config import ServerSettings

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
HEADERS_TOO_LARGE_RESPONSE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
# Most bytes read of a request before its handler starts. uvicorn's HTTP protocols keep a request's header section
# in memory whole, with no bound of their own, until it ends; a body's first bytes are in by then too (up to the
# protocol's 64 KiB flow-control mark, plus one read of the socket). A header section of nginx's or h11's size
# (8-16 KiB) is far below.
MAX_BYTES_BEFORE_HANDLER = 1 << 20
LINGER_SECONDS = 2.0
# uvicorn's timeout_keep_alive (an idle connection between requests is closed after it), and how long a new
# connection may stay silent before its first byte (`ReceiveDeadline._close_unused`).
KEEP_ALIVE_SECONDS = 5.0
# The uvicorn releases this module was tested with (tests/serving/test_transport.py): from the first, up to the
# second (excluded); pyproject.toml's range.
TESTED_UVICORN = ("0.35", "0.55")


class Connections:
    """One app's connections, by peer address (ASGI's `scope["client"]`), with the deadline they keep and whom a
    408 is reported to (`refused(status, outcome, detail)`). The app holds it (`app.connections`); its connections'
    protocols find it there."""

    def __init__(self, request_timeout: float, refused: Callable[[int, str, str], None] | None = None):
        self.request_timeout, self.refused = request_timeout, refused
        self.open: dict[tuple[str, int], ReceiveDeadline] = {}

    def of(self, scope: Any) -> ReceiveDeadline | _NoDeadline:
        """The receive deadline of this request's connection (one that does nothing when it has none)."""
        return self.open.get(scope.get("client")) or NO_DEADLINE


class GatheredWrites:
    """The transport as uvicorn's protocol sees it: writes of one event-loop turn go out together, in one
    `write` of the real transport right after the turn (see the module doc); everything else is the real
    transport's. Closing (or a half-close) sends what is gathered first; an abort drops it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, upgraded=None):
        self._transport, self._loop = transport, loop
        self._gathered: list[bytes] = []
        self._upgraded = upgraded  # called when the connection is handed to another protocol (a WebSocket)

    def __getattr__(self, name: str):  # get_extra_info, is_closing, pause_reading, ...: the real transport's
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._gathered:
            self._loop.call_soon(self.flush)
        self._gathered.append(data)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if self._upgraded is not None:
            self._upgraded()
        self._transport.set_protocol(protocol)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._gathered:
            data = self._gathered[0] if len(self._gathered) == 1 else b"".join(self._gathered)
            self._gathered = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._gathered)) + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._gathered = []
        self._transport.abort()


class ReceiveDeadline(asyncio.Protocol):
    """uvicorn's own HTTP protocol, plus a deadline for receiving each whole request (see the module doc). uvicorn
    builds one per connection, with the keyword arguments it gives its own protocols."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ):
        self._inner: asyncio.Protocol = uvicorn_protocol()(
            config=config, server_state=server_state, app_state=app_state, _loop=_loop
        )
        self._connections = _connections_of(config.loaded_app)  # after uvicorn's protocol loaded the config
        self._loop = _loop or asyncio.get_event_loop()
        self._transport: asyncio.Transport | None = None
        self._writes: GatheredWrites | None = None
        self._peer: tuple[str, int] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._receiving = False
        self._since = 0.0  # loop time of the first byte of the request coming in
        self._unhandled = 0  # bytes of the request coming in read before its handler started (-1: it has started)
        self._answering = False  # a request is whole and its answer not sent yet: later bytes wait their turn
        self._lingering: asyncio.TimerHandle | None = None
        self._unused: asyncio.TimerHandle | None = None  # until the connection's first byte (`_close_unused`)
        self.lost = False  # the connection is closed: a client that gave up on its answer (a timeout) is gone

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream (uvloop's is no asyncio subclass)
        peer = transport.get_extra_info("peername")
        if self._connections is not None and isinstance(peer, (tuple, list)) and len(peer) >= 2:
            self._peer = (str(peer[0]), int(peer[1]))
            self._connections.open[self._peer] = self
        self._writes = GatheredWrites(self._transport, self._loop, self._upgraded)
        self._inner.connection_made(cast(asyncio.Transport, self._writes))  # the real one's, bar the writes
        if self._peer is not None:
            self._unused = self._loop.call_later(KEEP_ALIVE_SECONDS, self._close_unused)

    def _close_unused(self) -> None:
        """A connection that has sent no byte since it opened is closed after KEEP_ALIVE_SECONDS, as uvicorn closes
        one idle between requests: the receive deadline starts at a request's first byte, and uvicorn's keep-alive
        timer after an answer, so a connection that never sent a byte was held for ever (the audit of 2026-12-01:
        260 of them took a server's open files, and every other client was refused)."""
        self._unused = None
        if self._transport is not None and not self._transport.is_closing():
            logger.debug("client %s sent nothing in %g s: closed", self._peer, KEEP_ALIVE_SECONDS)
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._unused is not None:
            self._unused.cancel()
            self._unused = None
        if self._lingering is not None:  # answered 408 or 431 already: drop what the client still sends
            return
        if not self._receiving and self._peer is not None:  # the first byte of a request
            self._receiving, self._since, self._unhandled = True, self._loop.time(), 0
            if self._timer is None and not self._answering:  # else its clock starts once the answer is sent
                self._timer = self._loop.call_at(self._since + self._timeout(), self._check)
        if self._unhandled >= 0 and self._receiving and not self._answering:
            self._unhandled += len(data)
            if self._unhandled > MAX_BYTES_BEFORE_HANDLER:
                return self._refuse(431, "headers_too_large", f"more than {MAX_BYTES_BEFORE_HANDLER:,} bytes")
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._lingering is not None:  # the client has closed too: the transport closes (a falsy return)
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._upgraded()  # no deadline any more, as for a connection that became a WebSocket
        if self._lingering is not None:  # the inner protocol was told at the 408
            self._lingering.cancel()
            return
        self._inner.connection_lost(exc)

    def _upgraded(self) -> None:
        """The connection became a WebSocket, or ended: no receive deadline from now on."""
        self._receiving = False
        if self._unused is not None:
            self._unused.cancel()
            self._unused = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._peer is not None and self._connections is not None and self._connections.open.get(self._peer) is self:
            del self._connections.open[self._peer]

    def _timeout(self) -> float:
        return self._connections.request_timeout if self._connections is not None else float("inf")

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def started(self) -> None:
        """The request's handler has started (its header section is in)."""
        self._unhandled = -1

    def received(self) -> None:
        """The whole request is in (or an answer has begun); the next byte starts the next one."""
        self._receiving, self._answering, self._unhandled = False, True, -1

    def answered(self) -> None:
        """The request's handler is done: bytes of a next request that came while it answered (pipelined, or a
        stray CRLF) start their deadline now, as the protocol reads them only now."""
        self._answering = False
        if self._receiving and self._transport is not None and not self._transport.is_closing():
            self._since, self._unhandled = self._loop.time(), 0
            if self._timer is None:
                self._timer = self._loop.call_at(self._since + self._timeout(), self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._receiving or self._answering or self._transport is None or self._transport.is_closing():
            return  # idle, or answering: the next request's first byte, or the answer's end, arms the timer
        timeout = self._timeout()
        due = self._since + timeout
        if self._loop.time() < due:  # a later request than the one that armed the timer: its own deadline
            self._timer = self._loop.call_at(due, self._check)
            return
        logger.info("client %s took more than %g s to send a request: disconnected", self._peer, timeout)
        self._refuse(408, "request_timeout", f"client {self._peer[0] if self._peer else '?'}", timeout)

    def _refuse(self, status: int, outcome: str, detail: str, timeout: float = 0.0) -> None:
        """Answer 408 or 431 before any handler has, half-close, and drop what the client still sends."""
        if self._transport is None or self._transport.is_closing():
            return
        if status == 408:
            message = f"Request Timeout: the request was not received within {timeout:g} s"
            response = REQUEST_TIMEOUT_RESPONSE
        else:
            message = f"Request Header Fields Too Large: {detail} before the request's end of headers"
            response = HEADERS_TOO_LARGE_RESPONSE
        body = error_body(message)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writes is not None:  # an answer of the same turn goes first
            self._writes.flush()
        self._transport.write(response % (len(body), body))
        if self._connections is not None and self._connections.refused is not None:  # counted and logged
            self._connections.refused(status, outcome, detail)
        if not self._transport.can_write_eof():
            self._transport.close()  # a handler waiting for the body gets `http.disconnect`
            return
        self._transport.write_eof()
        self._lingering = self._loop.call_later(LINGER_SECONDS, self._transport.close)
        # The inner protocol hears of the end now (a handler waiting for the body gets `http.disconnect`);
        # given an exception, it leaves the transport open for the linger.
        self._inner.connection_lost(ConnectionAbortedError(outcome))


def _connections_of(app: Any) -> Connections | None:
    """The `Connections` of an app of ours, inside the middleware uvicorn may wrap it in (proxy headers, message
    logging: each keeps the app it wraps as `.app`); None for another app (its connections get no deadline)."""
    for _ in range(8):
        if app is None or isinstance(getattr(app, "connections", None), Connections):
            return getattr(app, "connections", None)
        app = getattr(app, "app", None)
    return None


class _NoDeadline:
    lost = False  # not known without the protocol: taken as there

    @staticmethod
    def started() -> None:
        pass

    @staticmethod
    def received() -> None:
        pass

    @staticmethod
    def answered() -> None:
        pass


NO_DEADLINE = _NoDeadline()


class RequestDeadlineMiddleware:
    """ASGI middleware: stops the request's receive deadline once its body is in, or its answer begins."""

    def __init__(self, app, connections: Connections):
        self.app, self.connections = app, connections

    async def __call__(self, scope, receive, send) -> None:
        deadline = self.connections.of(scope) if scope["type"] == "http" else NO_DEADLINE
        if deadline is NO_DEADLINE:
            return await self.app(scope, receive, send)
        if not has_body(scope):
            deadline.received()
            return await self.app(scope, receive, send)

        async def receive_until_whole():
            message = await receive()
            if not message.get("more_body", False):
                deadline.received()
            return message

        async def send_stopping(message):
            if message["type"] == "http.response.start":
                deadline.received()
            await send(message)

        await self.app(scope, receive_until_whole, send_stopping)


def uvicorn_protocol() -> Callable[..., asyncio.Protocol]:
    """The HTTP protocol class uvicorn itself would pick (`http="auto"`: httptools when installed, else h11);
    RuntimeError, naming the tested releases, when uvicorn's table of protocols is not where it was."""
    try:
        return uvicorn.importer.import_from_string(uvicorn.config.HTTP_PROTOCOLS["auto"])
    except (AttributeError, KeyError, ImportError, uvicorn.importer.ImportFromStringError) as exc:
        raise RuntimeError(
            f"uvicorn {uvicorn.__version__}: its HTTP protocol table moved ({exc!r}); the server's "
            f"transport (mirrorapi/serving/transport.py) was tested with {_TESTED}"
        ) from None


_TESTED = f"uvicorn>={TESTED_UVICORN[0]},<{TESTED_UVICORN[1]}"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def check_uvicorn() -> str | None:
    """A warning when the installed uvicorn is outside the releases this module was tested with, else None."""
    version = metadata.version("uvicorn")
    if _release(TESTED_UVICORN[0]) <= _release(version) < _release(TESTED_UVICORN[1]):
        return None
    return (
        f"uvicorn {version} is outside the releases the server's transport was tested with ({_TESTED}); "
        "if requests fail, install one of those"
    )


def uvicorn_options(settings: ServerSettings) -> dict:
    """The one uvicorn configuration of the server: `uvicorn.run(app, **options)` (the tests use it too); the
    deadline of each request is the app's (`Connections`), so the same options serve worker processes."""
    uvicorn_protocol()  # fails here, at start, when uvicorn's protocols moved
    # log_config=None: uvicorn's loggers go through ours; its access log is replaced by RequestLogWriter's lines.
    # No proxy-header rewriting: the server binds 127.0.0.1 by default and reports no client addresses.
    # WebSockets (OpenEnv's /ws): websockets' sans-I/O protocol (timers, no task per connection beyond the app's);
    # no per-message compression (a zlib context per connection: gigabytes at 16,384 episodes).
    return dict(
        host=settings.host,
        port=settings.port,
        http=ReceiveDeadline,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_max_size=settings.max_body_bytes,
        ws_ping_interval=30.0,
        ws_ping_timeout=30.0,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
